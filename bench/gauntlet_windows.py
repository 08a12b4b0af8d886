"""One gauntlet simulation seen over time: mean TTFT by window of arrival, per policy.

A gauntlet cell's figure is one number per seed; a loss that is a transient (a backlog
built at the start and drained slowly) looks the same there as a steady one. This runs
the gauntlet's own simulation (``sim.experiments.gauntlet.records``: the same ``Job`` at
the load read from a gauntlet JSON) for one seed and prints, per policy, the measured
requests' mean TTFT, the decisions' reasons, and the mean TTFT by ``--window`` seconds of
arrival (all requests, warm-up included, so the start shows), each followed by ``/`` and
the mean TTFT the policy predicted for them where it predicts one (``locality``), and the
prompt tokens computed from scratch by window.

    .venv/bin/python bench/gauntlet_windows.py --workload docqa --routers 4 --seed 76 \\
        --policies locality,locality@work_weight=0,prefix_affinity
"""

from __future__ import annotations

import argparse
import collections

from gauntlet_cell import add_cell_args, knee_of

from sim.des.simulation import Record
from sim.experiments.gauntlet import Job, measured, records


def _window(done: list[Record]) -> str:
    """A window's mean TTFT, and its mean predicted TTFT where the policy predicts one."""
    text = f"{sum(r.ttft_s for r in done) / len(done):.1f}"
    predicted = [r.predicted_s for r in done if r.predicted_s is not None]
    return text + (f"/{sum(predicted) / len(predicted):.1f}" if predicted else "")


def _uncached(done: list[Record]) -> int:
    """Prompt tokens computed from scratch (neither a GPU nor a pool hit)."""
    return sum(r.prompt_tokens - r.gpu_hit_tokens - r.pool_hit_tokens for r in done)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_args(ap)
    ap.add_argument("--load", type=float, default=1.0, help="multiple of the knee")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--policies", default="locality,prefix_affinity")
    ap.add_argument("--window", type=float, default=50.0, help="seconds of arrival")
    ap.add_argument("--shared-index", action="store_true",
                    help="the routers share one index (as with --index redis://...)")
    args = ap.parse_args()
    knee = knee_of(args)
    for policy in args.policies.split(","):
        job = Job(args.workload, args.hardware, args.replicas, args.routers, knee * args.load,
                  policy, args.seed, args.duration, "study-27b", shared_index=args.shared_index)
        done = records(job)
        kept = measured(job, done)
        mean = sum(r.ttft_s for r in kept) / max(1, len(kept))
        reasons = collections.Counter(r.reason for r in kept).most_common(4)
        by: dict[int, list[Record]] = collections.defaultdict(list)
        for r in done:
            by[int(r.arrival // args.window)].append(r)
        print(f"{policy}: {len(kept)} measured, mean TTFT {mean:.2f} s, reasons {dict(reasons)}")
        print("  by arrival: " + " ".join(f"{k * args.window:g}s:{_window(v)}"
                                          for k, v in sorted(by.items())))
        print("  uncached prompt tokens (M): " + " ".join(
            f"{k * args.window:g}s:{_uncached(v) / 1e6:.2f}" for k, v in sorted(by.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
