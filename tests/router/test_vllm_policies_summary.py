"""bench/vllm_policies.py's summary: the reference policy's paired ratios over the others,
by prompt set, so that an arm of ``locality`` can be set against a baseline afterwards
(``--summarise RESULT --reference P``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import pytest
from vllm_policies import markdown, summarise


def _run(policy: str, seed: int, mean: float, p90: float) -> dict[str, object]:
    return {"workload": "prefix", "policy": policy, "seed": seed, "mean_ttft_s": mean,
            "p90_ttft_s": p90, "hit_rate": 0.9, "max_share": 0.5, "failed": 0.0,
            "idle_arrivals": 0.3}


RUNS = [_run("locality", 1, 0.10, 0.20), _run("least_loaded", 1, 0.05, 0.10),
        _run("locality@x=1", 1, 0.20, 0.20),
        _run("locality", 2, 0.30, 0.40), _run("least_loaded", 2, 0.10, 0.20),
        _run("locality@x=1", 2, 0.30, 0.80)]


def test_ratios_are_paired_by_prompt_set_against_the_reference() -> None:
    over = summarise(RUNS)["prefix"]["locality_over"]
    mean, lo, hi = over["least_loaded"]["mean_ttft_s"]
    assert mean == pytest.approx(2.5) and lo < 2.5 < hi  # set 1: 2.0, set 2: 3.0
    assert set(over) == {"least_loaded", "locality@x=1"}


def test_another_reference_and_its_table_header() -> None:
    summary = summarise(RUNS, "locality@x=1")
    over = summary["prefix"]["locality_over"]
    assert over["least_loaded"]["p90_ttft_s"][0] == pytest.approx(3.0)  # 2.0 and 4.0
    assert over["locality"]["mean_ttft_s"][0] == pytest.approx(1.5)  # 2.0 and 1.0
    assert "| locality@x=1 / this: mean [95 % CI] | p90 |" in markdown(summary)


def test_a_reference_not_in_the_run_gives_no_ratios() -> None:
    assert summarise(RUNS, "prefix_affinity")["prefix"]["locality_over"] == {}
