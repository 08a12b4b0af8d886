"""One gauntlet cell over any seeds: every policy's mean and p90 TTFT, and locality's ratio.

The gauntlet (``lmroute sim gauntlet``) runs seeds 0..N-1 of every cell; a change developed
on one cell's seeds needs seeds it was not developed on. This runs the same simulations
(``sim.experiments.gauntlet``: its ``Job`` and ``Runner``; the load as a multiple of the
workload's knee read from a gauntlet JSON) for the seeds given, with the gauntlet's own
statistics (``sim.experiments.gauntlet_report``): per load, each policy's mean over seeds
of the per-seed mean and p90 TTFT with t-based 95 % CIs, and each ``locality`` arm's ratio
to the best other policy, paired by seed (the geometric mean of per-seed ratios) with its CI.

    .venv/bin/python bench/gauntlet_cell.py --workload docqa --hardware no-pool \\
        --seeds 32-47 --policies locality,locality@copy_benefit=0,load_aware,affinity_window
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sim.experiments import report
from sim.experiments.gauntlet import (
    BASE_REPLICAS,
    Cell,
    Job,
    Runner,
    default_jobs,
    is_locality,
    raw_row,
)
from sim.experiments.gauntlet_report import aggregate_rows, ratios


def seeds_of(text: str) -> list[int]:
    """``"0,3,5-7"`` -> ``[0, 3, 5, 6, 7]``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _ci(value: float, ci: list[float]) -> str:
    return f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def add_cell_args(ap: argparse.ArgumentParser) -> None:
    """The options naming one gauntlet cell and where its knee is read from."""
    ap.add_argument("--workload", required=True)
    ap.add_argument("--hardware", default="study-27b")
    ap.add_argument("--replicas", type=int, default=BASE_REPLICAS)
    ap.add_argument("--routers", type=int, default=1)
    ap.add_argument("--knees-from", type=Path, default=Path("docs/gauntlet.json"))
    ap.add_argument("--duration", type=float, default=400.0)


def knee_of(args: argparse.Namespace) -> float:
    """The workload's knee (a rate scale) from the gauntlet JSON ``--knees-from``."""
    return float(json.loads(args.knees_from.read_text())["knees"][args.workload]["rate_scale"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_args(ap)
    ap.add_argument("--loads", default="0.25,0.5,1,1.5", help="multiples of the knee")
    ap.add_argument("--seeds", default="0-7", help="e.g. 32-47 or 0,2,5-9")
    ap.add_argument("--policies", default="locality,prefix_affinity,affinity_window,load_aware,"
                    "least_loaded,fixed")
    args = ap.parse_args()
    knee = knee_of(args)
    cell = Cell("cell", args.workload, args.hardware, args.replicas, args.routers)
    seeds, policies = seeds_of(args.seeds), args.policies.split(",")
    loads = [float(v) for v in args.loads.split(",")]
    plan = [(load, policy, seed) for load in loads for policy in policies for seed in seeds]
    jobs = [Job(args.workload, args.hardware, args.replicas, args.routers, knee * load, policy,
                seed, args.duration, "study-27b") for load, policy, seed in plan]
    with report.progress_bar(cell.label, total=len(jobs)) as bar:
        runner = Runner(default_jobs(), bar)
        try:
            results = runner.run(jobs)
        finally:
            runner.close()
    raw = [raw_row(cell, load, j, res)
           for (load, _, _), j, res in zip(plan, jobs, results, strict=True)]
    ratio = {(r["load"], p): r for p in policies if is_locality(p) for r in ratios(raw, p)}
    print(f"{cell.label}, seeds {args.seeds}\n")
    print("| load | policy | mean TTFT (s) | p90 TTFT (s) | / best other: mean | p90 |")
    print("|---|---|---|---|---|---|")
    for row in aggregate_rows(raw):
        r = ratio.get((row["load"], row["policy"]))
        vs = (" | " if r is None else f"{_ci(r['ratio_mean'], r['ratio_mean_ci'])} "
              f"{r['best_other_mean']} | {_ci(r['ratio_p90'], r['ratio_p90_ci'])} "
              f"{r['best_other_p90']}")
        print(f"| {row['load']:g} | {row['policy']} | {_ci(row['ttft_mean_s'], row['ttft_mean_ci'])}"
              f" | {_ci(row['ttft_p90_s'], row['ttft_p90_ci'])} | {vs} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
