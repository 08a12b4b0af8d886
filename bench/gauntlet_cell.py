"""One gauntlet cell over any seeds: every policy's mean and p90 TTFT, and locality's ratio.

The gauntlet (``lmroute sim gauntlet``) runs seeds 0..N-1 of every cell; a change developed
on one cell's seeds needs seeds it was not developed on. This runs the same simulations
(``sim.experiments.gauntlet.Job``: the cell's hardware row, fleet, routers, the load as a
multiple of the workload's knee read from a gauntlet JSON) for the seeds given, and prints,
per load, each policy's mean over seeds of the per-seed mean and p90 TTFT (the gauntlet's
point estimates) and each ``locality`` arm's ratio to the best other policy on each.

    .venv/bin/python bench/gauntlet_cell.py --workload docqa --hardware no-pool \\
        --seeds 32-47 --policies locality,locality@copy_benefit=0,load_aware,affinity_window
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from sim.experiments.gauntlet import BASE_REPLICAS, Job, default_jobs, is_locality, simulate


def seeds_of(text: str) -> list[int]:
    """``"0,3,5-7"`` -> ``[0, 3, 5, 6, 7]``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def point(job: Job) -> tuple[float, float]:
    """(mean, p90) TTFT of one simulation's measured requests."""
    x = np.asarray(simulate(job), dtype=float)
    return float(x.mean()), float(np.percentile(x, 90))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--hardware", default="study-27b")
    ap.add_argument("--replicas", type=int, default=BASE_REPLICAS)
    ap.add_argument("--routers", type=int, default=1)
    ap.add_argument("--loads", default="0.25,0.5,1,1.5", help="multiples of the knee")
    ap.add_argument("--seeds", default="0-7", help="e.g. 32-47 or 0,2,5-9")
    ap.add_argument("--policies", default="locality,prefix_affinity,affinity_window,load_aware,"
                    "least_loaded,fixed")
    ap.add_argument("--knees-from", type=Path, default=Path("docs/gauntlet.json"))
    ap.add_argument("--duration", type=float, default=400.0)
    args = ap.parse_args()
    knee = json.loads(args.knees_from.read_text())["knees"][args.workload]["rate_scale"]
    seeds, policies = seeds_of(args.seeds), args.policies.split(",")
    loads = [float(v) for v in args.loads.split(",")]
    jobs = [Job(args.workload, args.hardware, args.replicas, args.routers, knee * load, policy,
                seed, args.duration, "study-27b")
            for load in loads for policy in policies for seed in seeds]
    with ProcessPoolExecutor(default_jobs()) as pool:
        results = iter(pool.map(point, jobs))
    print(f"{args.workload} {args.hardware} {args.replicas}r {args.routers}R, seeds {args.seeds}\n")
    print("| load | policy | mean TTFT (s) | p90 TTFT (s) | / best other: mean | p90 |")
    print("|---|---|---|---|---|---|")
    for load in loads:
        table = {p: np.array([next(results) for _ in seeds]).mean(axis=0) for p in policies}
        others = [p for p in policies if not is_locality(p)]
        best = [min(table[p][k] for p in others) if others else float("nan") for k in (0, 1)]
        for p, (mean, p90) in table.items():
            ratio = (f"{mean / best[0]:.2f} | {p90 / best[1]:.2f}" if is_locality(p) and others
                     else " | ")
            print(f"| {load:g} | {p} | {mean:.2f} | {p90:.2f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
