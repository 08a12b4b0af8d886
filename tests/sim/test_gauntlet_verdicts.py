"""bench/gauntlet_verdicts.py --target/--with: a locality variant run alone joins a
committed run's baselines and is judged against them only (never against ``locality``
itself), and rows run at another knee never pair with the baselines'."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from gauntlet_verdicts import retarget, verdicts

CELL = {"cell": "docqa no-pool 4r 1R", "axis": "hardware", "workload": "docqa",
        "hardware": "no-pool", "replicas": 4, "routers": 1}
KNEES = {"docqa": {"rate_scale": 0.9, "given": True, "light_p90_s": 1.0, "slo_p90_s": 5.0}}


def _raw(policy: str, load: float, mean: float, p90: float, *, scale: float = 0.9
         ) -> list[dict[str, Any]]:
    # Four seeds, a little noise each, so the intervals are finite.
    return [{**CELL, "load": load, "rate_scale": scale, "policy": policy, "seed": s, "n": 100,
             "mean": mean * (1 + 0.01 * s), "p90": p90 * (1 + 0.01 * s)} for s in range(4)]


def _doc(raw: list[dict[str, Any]]) -> dict[str, Any]:
    return {"raw": raw, "knees": KNEES, "ratios": [], "capacity": []}


def test_a_variant_is_judged_against_the_baselines_alone() -> None:
    committed = _doc([*_raw("least_loaded", 0.5, 1.0, 2.0), *_raw("least_loaded", 1.5, 2.0, 4.0),
                      *_raw("locality", 0.5, 0.5, 1.0), *_raw("locality", 1.5, 1.0, 2.0)])
    # The variant: 10 % slower than least_loaded at 0.5x, 30 % at 1.5x, whose p90 (5.2 s)
    # is past the SLO where least_loaded's (4.0 s) is not.
    variant = _doc([*_raw("locality@tie_work=false", 0.5, 1.1, 2.2),
                    *_raw("locality@tie_work=false", 1.5, 2.6, 5.2)])
    doc = retarget(committed, "locality@tie_work=false", [variant])
    by_load = {r["load"]: r for r in doc["ratios"]}
    assert by_load[0.5]["best_other_mean"] == "least_loaded"  # not locality, twice as fast
    assert abs(by_load[0.5]["ratio_mean"] - 1.1) < 1e-9
    assert abs(by_load[1.5]["ratio_p90"] - 1.3) < 1e-9
    text = "\n".join(verdicts(doc))
    assert "## 1. Up to saturation: 0 of 2 (cell, metric) pass both" in text
    assert "## 2. Past saturation: 0 of 1 cells within 1.10x" in text
    assert "- docqa no-pool 4r 1R: locality@tie_work=false 0.5, best other 1.5" in text
    # locality itself, judged from the same rows, wins everywhere: the capacity bar holds.
    text = "\n".join(verdicts(retarget(committed, "locality", [variant])))
    assert "## 3. Capacity: 1 of 1 cells at least the best other's" in text
    assert "## 4. At least 20 % better on mean and p90: 2 (cell, load) points" in text


def test_rows_run_at_another_knee_do_not_pair() -> None:
    committed = _doc(_raw("least_loaded", 0.5, 1.0, 2.0))
    variant = _doc(_raw("locality@x=1", 0.5, 1.1, 2.2, scale=0.8))
    assert retarget(committed, "locality@x=1", [variant])["ratios"] == []
