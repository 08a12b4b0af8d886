"""``lmroute ab``: the analysis on seeded synthetic data, and a small real emulated run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.des.trace import TRACE_BLOCK_TOKENS, TraceRecord
from sim.experiments.ab_sessions import parse_arms, plan_generated, trace_conversations, trace_prompt
from sim.experiments.ab_stats import abba_order, analyze, check_coverage, difference, synthetic_turns


def test_abba_order() -> None:
    assert abba_order(4) == list("ABBA")
    assert abba_order(8) == list("ABBAABBA")
    with pytest.raises(ValueError):
        abba_order(6)


@pytest.mark.parametrize("design", ["abba", "interleaved"])
def test_identical_arms_ci_covers_zero_in_19_of_20_seeds(design: str) -> None:
    covered, runs = check_coverage(range(20), resamples=1000, design=design,
                                   sessions=8 if design == "abba" else 16)
    assert runs == 20 and covered >= 19


def test_a_real_shift_is_found() -> None:
    # B 80 % slower (sessions vary by a factor e^0.35 on their own): found in every seed.
    found = 0
    for seed in range(20):
        d = difference(synthetic_turns(seed, shift=0.8), np.random.default_rng(seed), 1000)
        found += d["ci_low"] > 0
    assert found >= 19


def test_drift_does_not_make_a_difference_under_abba() -> None:
    # A system that slows 15 % a block: ABBA puts both arms at the same mean position.
    out = analyze(synthetic_turns(3, drift=0.15), {"A": "x", "B": "x"}, seed=3)
    assert out["difference"]["ci_low"] <= 0 <= out["difference"]["ci_high"]
    assert "no significant difference" in out["verdict"]


def test_analysis_contract_and_errors() -> None:
    turns = synthetic_turns(1, shift=-0.5)
    turns[0] |= {"ttft_s": None, "error": "boom"}
    out = analyze(turns, {"A": "fixed", "B": "locality"}, seed=1)
    a, b = out["arms"]
    assert {"name", "n", "ttft_p50_s", "ttft_p90_s", "ttft_mean_s", "errors"} <= set(a)
    assert a["errors"] == 1 and a["n"] == 4 * 8 * 5 // 2 - 1 and b["n"] == 80
    d = out["difference"]
    assert {"metric", "estimate", "ci_low", "ci_high", "p_value"} <= set(d)
    assert d["ci_high"] < 0 and d["p_value"] < 0.05
    assert out["verdict"].startswith("B (locality) is faster")


def test_arm_specs() -> None:
    a, b = parse_arms("alternating@pool=off,locality@stay_margin=0.3@pool=on")
    assert (a.policy, a.pool, a.options) == ("alternating", False, {})
    assert (b.policy, b.pool, b.options) == ("locality", True, {"stay_margin": 0.3})
    with pytest.raises(ValueError):
        parse_arms("fixed")
    with pytest.raises(ValueError):
        parse_arms("fixed@pool=maybe,fixed")


def test_sessions_are_seeded() -> None:
    assert plan_generated(3, 4, 2, 1000, 9000) == plan_generated(3, 4, 2, 1000, 9000)
    assert plan_generated(3, 4, 2, 1000, 9000) != plan_generated(4, 4, 2, 1000, 9000)


def test_trace_prompts_share_text_where_hash_ids_do() -> None:
    r1 = TraceRecord(0, 1000, 5, (0, 7))
    r2 = TraceRecord(1, 1500, 5, (0, 7, 9))
    p1, p2 = trace_prompt(r1), trace_prompt(r2)
    assert len(p1) == 4000 and len(p2) == 6000
    assert p2.startswith(p1[: 4 * TRACE_BLOCK_TOKENS * 1])
    assert p1 == p2[:4000]  # blocks 0 and 7 are equal, so the whole shorter prompt is
    convs = trace_conversations([r1, r2, TraceRecord(2, 10, 1, (0, 8))])
    assert convs == [(r1, r2)]


def _lmroute(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "router.cli", "ab", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("use_trace", [False, True])
def test_emulated_run_end_to_end_and_resume(tmp_path: Path, use_trace: bool) -> None:
    out = tmp_path / "ab.json"
    png = tmp_path / "ab.png"
    args = ["--emulated", "--arms", "fixed,round_robin", "--pool", "off", "--blocks", "4",
            "--sessions-per-block", "2", "--turns", "3", "--time-scale", "0.02",
            "--min-start-tokens", "4096", "--max-start-tokens", "8192", "--seed", "5",
            "--json", str(out), "--plot", str(png)]
    if use_trace:
        args += ["--trace", "mooncake"]
    done = _lmroute(*args)
    assert done.returncode == 0, done.stderr
    assert "Verdict:" in done.stdout and "| A | fixed |" in done.stdout
    doc = json.loads(out.read_text())
    assert [a["name"] for a in doc["arms"]] == ["A", "B"]
    for arm in doc["arms"]:
        assert arm["n"] > 0 and arm["errors"] == 0
        assert {"ttft_p50_s", "ttft_p90_s", "ttft_mean_s"} <= set(arm)
    assert set(doc["difference"]) >= {"metric", "estimate", "ci_low", "ci_high", "p_value"}
    assert doc["difference"]["metric"] == "ttft_p50_s" and doc["verdict"]
    assert png.stat().st_size > 10_000
    assert len(doc["done"]) == 8
    # ABBA: blocks 0 and 3 ran arm A, 1 and 2 arm B; round robin moved turns across replicas.
    assert {t["block"] for t in doc["turns"] if t["arm"] == "A"} == {0, 3}
    assert len({t["replica"] for t in doc["turns"] if t["arm"] == "B"}) == 2
    # Resume: forget the last block as if the run had been cut off there.
    n = len(doc["turns"])
    cut = {k: v for k, v in doc.items() if k in ("config", "units", "wall_s")}
    cut["done"] = [d for d in doc["done"] if not d.startswith("3/")]
    cut["turns"] = [t for t in doc["turns"] if t["block"] != 3]
    out.write_text(json.dumps(cut))
    again = _lmroute("--resume", str(out))
    assert again.returncode == 0, again.stderr
    resumed = json.loads(out.read_text())
    assert len(resumed["turns"]) == n and len(resumed["done"]) == 8
    assert resumed["turns"][: len(cut["turns"])] == cut["turns"]
