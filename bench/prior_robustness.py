"""A prior wrong by 3x (or 1/3) in one term: ``locality`` against itself with the true prior.

Run: ``.venv/bin/python bench/prior_robustness.py [--seeds 3] [--load 4] [--json PATH]``
(4 replicas, the load sweep's Poisson chat sessions, pool off and on, 2 worker processes).

For each term of the cost model, a hardware profile is derived from ``study-27b`` with
that term scaled (``fixed`` = ``prefill_fixed_s``, ``linear`` = ``prefill_token_s``,
``attention`` = ``prefill_token2_s``, ``load`` = ``load_fixed_s`` and the pool's
bandwidth). ``locality`` keeps its own prior (the study fit) and calibrates online;
``locality+oracle-prior`` is handed the profile's timings (``sim.experiments.arms``). Both
replay the same seeded workload, so each seed pairs; the report is the ratio of mean
TTFT honest / oracle per seed, its geometric mean and a Student-t 95 % CI on the logs.
The issue's bar: within 1.05x.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from scipy import stats as sps

from sim.experiments import scenarios
from sim.replica.profiles import Profile, load_profile

TERMS = ("fixed", "linear", "attention", "load")


def wrong_in(term: str, factor: float, base: Profile) -> Profile:
    """``base`` with one term of its physics scaled by ``factor``."""
    r = dataclasses.replace
    name = f"{term}-{factor:g}x"
    if term == "fixed":
        return r(base, name=name, prefill_fixed_s=base.prefill_fixed_s * factor)
    if term == "linear":
        return r(base, name=name, prefill_token_s=base.prefill_token_s * factor)
    if term == "attention":
        return r(base, name=name, prefill_token2_s=base.prefill_token2_s * factor)
    return r(base, name=name, load_fixed_s=base.load_fixed_s * factor,
             load_bytes_per_s=base.load_bytes_per_s / factor)


def one(job: tuple[str, float, int, float, float]) -> list[dict[str, Any]]:
    term, factor, seed, load, duration = job
    profile = wrong_in(term, factor, load_profile("study-27b"))
    result = scenarios.load(profile, replicas=4, loads=(load,), seed=seed, duration_s=duration,
                            policies=["locality", "locality+oracle-prior"])
    return [{"term": term, "factor": factor, "seed": seed, **row} for row in result.rows]


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = sorted({(r["term"], r["factor"], r["pool"]) for r in rows})
    for term, factor, pool in keys:
        by_seed: dict[int, dict[str, float]] = {}
        for r in rows:
            if (r["term"], r["factor"], r["pool"]) == (term, factor, pool):
                by_seed.setdefault(r["seed"], {})[r["policy"]] = r["ttft_mean_s"]
        logs = [math.log(v["locality"] / v["locality+oracle-prior"]) for v in by_seed.values()]
        mean = statistics.fmean(logs)
        half = (sps.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
                if len(logs) > 1 else math.nan)
        out.append({"term": term, "factor": factor, "pool": pool, "seeds": len(logs),
                    "ratio": math.exp(mean), "ci": [math.exp(mean - half), math.exp(mean + half)]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--load", type=float, default=4.0, help="sessions/min/replica")
    ap.add_argument("--duration", type=float, default=1800.0)
    ap.add_argument("--factors", type=float, nargs="+", default=[3.0, 1 / 3])
    ap.add_argument("--json", default="docs/prior-robustness.json")
    args = ap.parse_args()
    jobs = [(t, f, s, args.load, args.duration) for t in TERMS for f in args.factors
            for s in range(args.seeds)]
    with ProcessPoolExecutor(2) as pool:
        rows = [row for part in pool.map(one, jobs) for row in part]
    summary = summarise(rows)
    with open(args.json, "w") as fh:
        json.dump({"params": vars(args), "summary": summary, "rows": rows}, fh, indent=1)
    print("| term | factor | pool | honest / oracle prior, mean TTFT | 95 % CI |")
    print("|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['term']} | {s['factor']:.3g} | {s['pool']} | {s['ratio']:.3f} | "
              f"[{s['ci'][0]:.3f}, {s['ci'][1]:.3f}] |")


if __name__ == "__main__":
    main()
