"""When each policy computes each shared prefix, in one gauntlet cell (a diagnostic).

For one workload, hardware row, fleet and load (a multiple of the workload's knee, as in
``lmroute sim gauntlet``), every policy and seed: the mean and p90 TTFT over the
gauntlet's measured window (arrivals after the first ``WARMUP`` of the run), the mean
TTFT per minute of arrivals (cold start against steady state), the decisions by reason,
and every request that computed most of a long prompt (at least ``--min-tokens`` tokens,
under half of it a GPU hit): when it arrived, where it went, its size, its TTFT and the
policy's reason. With no pool these are the copies: a shared document computed again on
another replica.

    .venv/bin/python bench/copy_timing.py --workload docqa --hardware no-pool \
        --knee 0.8781260801866497 --load 1 --seeds 0,1,2 --policies locality,load_aware
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from sim.des.generators import GENERATORS
from sim.experiments.gauntlet import BASE_REPLICAS, Job, measured, records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="docqa", choices=sorted(GENERATORS))
    ap.add_argument("--hardware", default="no-pool")
    ap.add_argument("--replicas", type=int, default=BASE_REPLICAS)
    ap.add_argument("--knee", type=float, required=True, help="the workload's knee (rate scale)")
    ap.add_argument("--load", type=float, default=1.0, help="multiple of the knee")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--policies", default="locality,load_aware")
    ap.add_argument("--duration", type=float, default=400.0)
    ap.add_argument("--min-tokens", type=int, default=20000)
    args = ap.parse_args()
    for policy in args.policies.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            job = Job(args.workload, args.hardware, args.replicas, 1, args.knee * args.load,
                      policy, seed, args.duration, "study-27b")
            done = records(job)
            window = np.array([r.ttft_s for r in measured(job, done)])
            per_minute: dict[int, list[float]] = collections.defaultdict(list)
            for r in done:
                if r.arrival < args.duration:
                    per_minute[int(r.arrival // 60)].append(r.ttft_s)
            print(f"{policy} seed {seed}: mean {window.mean():.2f} s, p90 "
                  f"{np.percentile(window, 90):.2f} s over {window.size} requests; per minute "
                  f"{[round(float(np.mean(v)), 1) for _, v in sorted(per_minute.items())]}; "
                  f"{dict(collections.Counter(r.reason for r in done))}")
            computed = [r for r in sorted(done, key=lambda r: r.arrival)
                        if r.prompt_tokens >= args.min_tokens
                        and r.gpu_hit_tokens < r.prompt_tokens / 2]
            for r in computed:
                print(f"    {r.arrival:7.1f} s  {r.replica}  {r.prompt_tokens:6d} tokens  "
                      f"TTFT {r.ttft_s:5.1f} s  {r.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
