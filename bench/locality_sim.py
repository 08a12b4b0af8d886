"""``locality`` against the baselines over a load sweep, several seeds: JSON and a PNG.

Run: ``.venv/bin/python bench/locality_sim.py`` (defaults: 4 replicas, loads 1-10 sessions/
min/replica, seeds 0-4, pool off and on, 2 worker processes; ~4 CPU minutes). Writes
``docs/locality-sim.json`` and ``docs/locality-sim.png``; prints a markdown summary.

Each (seed, load) point is ``sim.experiments.scenarios.load`` with that one load: every
registered policy (``policies.registry.names()``, so ``affinity_window`` and ``load_aware``
too; docs/locality.md's run predates them) replays the same seeded workload (common random
numbers), so a seed's policies pair one to one.
For each pool setting, load and metric (mean and p90 TTFT of the measured requests):

- ``best``: the baseline (every policy but ``locality``) with the lowest across-seed mean;
- ``rel``: ``locality / best - 1`` per seed, its across-seed mean and Student-t 95 % CI;
- ``rel_min``: the same against the per-seed minimum over all baselines (stricter: an
  oracle that picks the best baseline after seeing each seed's outcome);
- ``rel_fixed``: against ``fixed`` (the pool-off claim: never more than 5 % worse).
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from scipy import stats as sps

from sim.experiments.scenarios import load as load_sweep
from sim.replica.profiles import load_profile

METRICS = ("ttft_mean_s", "ttft_p90_s")
OURS = "locality"


def one_point(profile: str, replicas: int, load: float, seed: int,
              duration_s: float) -> list[dict[str, Any]]:
    result = load_sweep(load_profile(profile), replicas=replicas, loads=[load], seed=seed,
                        duration_s=duration_s)
    return [{"seed": seed, "load": load, "policy": r["policy"], "pool": r["pool"],
             "n": r["n"], **{m: r[m] for m in (*METRICS, "ttft_p50_s")}} for r in result.rows]


def mean_ci(values: list[float]) -> tuple[float, list[float]]:
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, [m, m]
    half = sps.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    return m, [m - half, m + half]


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cell: dict[tuple[str, float, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        cell.setdefault((r["pool"], r["load"], r["policy"]), {})[r["seed"]] = r
    out = []
    for pool, load in sorted({(p, x) for p, x, _ in cell}):
        policies = sorted(p for q, x, p in cell if (q, x) == (pool, load))
        baselines = [p for p in policies if p != OURS]
        seeds = sorted(cell[(pool, load, OURS)])
        for metric in METRICS:
            def val(policy: str, seed: int, metric: str = metric,
                    at: tuple[str, float] = (pool, load)) -> float:
                return float(cell[(*at, policy)][seed][metric])

            means = {p: statistics.fmean(val(p, s) for s in seeds) for p in policies}
            best = min(baselines, key=means.__getitem__)
            rel, rel_ci = mean_ci([val(OURS, s) / val(best, s) - 1 for s in seeds])
            rmin, rmin_ci = mean_ci([val(OURS, s) / min(val(b, s) for b in baselines) - 1
                                     for s in seeds])
            rfix, rfix_ci = mean_ci([val(OURS, s) / val("fixed", s) - 1 for s in seeds])
            out.append({"pool": pool, "load": load, "metric": metric, "seeds": len(seeds),
                        "means": means, "best": best, "rel": rel, "rel_ci": rel_ci,
                        "rel_min": rmin, "rel_min_ci": rmin_ci,
                        "rel_fixed": rfix, "rel_fixed_ci": rfix_ci})
    return out


def markdown(summary: list[dict[str, Any]]) -> str:
    lines = ["| pool | load | metric | locality | best baseline | rel. diff (95 % CI) "
             "| vs per-seed min | vs fixed |", "|" + "---|" * 8]
    for s in summary:
        lo, hi = s["rel_ci"]
        lines.append(
            f"| {s['pool']} | {s['load']:g} | {s['metric'][5:-2]} | {s['means'][OURS]:.3g} "
            f"| {s['best']} {s['means'][s['best']]:.3g} | {100 * s['rel']:+.1f} % "
            f"({100 * lo:+.1f} … {100 * hi:+.1f}) | {100 * s['rel_min']:+.1f} % "
            f"| {100 * s['rel_fixed']:+.1f} % |")
    return "\n".join(lines) + "\n"


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = sorted({s["pool"] for s in summary})
    fig, axes = plt.subplots(len(METRICS), len(pools), figsize=(11, 7.5), sharex=True,
                             squeeze=False)
    for i, metric in enumerate(METRICS):
        for j, pool in enumerate(pools):
            ax = axes[i][j]
            cells = sorted((s for s in summary if s["pool"] == pool and s["metric"] == metric),
                           key=lambda s: s["load"])
            xs = [s["load"] for s in cells]
            for k, policy in enumerate(sorted(cells[0]["means"])):
                ours = policy == OURS
                ax.plot(xs, [s["means"][policy] for s in cells], marker="o",
                        color="black" if ours else f"C{k}", linewidth=2.6 if ours else 1.1,
                        markersize=5 if ours else 3, alpha=1.0 if ours else 0.75,
                        label=policy, zorder=3 if ours else 2)
            ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{metric[5:-2]} TTFT, pool {pool}", fontsize=10)
            if j == 0:
                ax.set_ylabel("seconds (log; mean over seeds)")
            if i == len(METRICS) - 1:
                ax.set_xlabel("load, sessions / min / replica")
    axes[0][0].legend(fontsize=8)
    seeds = summary[0]["seeds"]
    fig.suptitle(f"lmroute sim: locality (black) vs baselines, {seeds} seeds", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--loads", type=float, nargs="+", default=[1, 2, 4, 6, 8, 10])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--duration", type=float, default=1800.0, help="simulated seconds")
    p.add_argument("--profile", default="study-27b")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--json", type=Path, default=Path("docs/locality-sim.json"))
    p.add_argument("--plot", type=Path, default=Path("docs/locality-sim.png"))
    args = p.parse_args()

    points = [(x, s) for s in args.seeds for x in args.loads]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_point, args.profile, args.replicas, x, s, args.duration)
                   for x, s in points]
        rows = [r for f in futures for r in f.result()]
    summary = summarise(rows)
    params = {"profile": args.profile, "replicas": args.replicas, "loads": args.loads,
              "seeds": args.seeds, "duration_s": args.duration, "metrics": list(METRICS),
              "ci": "Student-t 95 % over seeds of the per-seed relative difference"}
    args.json.write_text(json.dumps({"params": params, "summary": summary, "rows": rows},
                                    indent=1) + "\n", encoding="utf-8")
    plot(summary, args.plot)
    print(markdown(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
