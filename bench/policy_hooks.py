"""A policy's own cost per request, in process: ``choose``, ``dispatched``, ``observe``.

Run: ``.venv/bin/python bench/policy_hooks.py [--policies locality round_robin ...]
[--replicas 2] [--in-flight 64] [--n 5000] [--rounds 5] [--shuffled]``.

A loop of short requests (3 prompt tokens, one block cached on every replica, 50
sessions), 200 us apart on the policy's clock (``RequestView.now``): each is chosen and
dispatched, and once ``--in-flight`` are out the oldest is observed (its first token and
its end at once, ``phase="done"``), so the queues stay ``--in-flight`` deep over the
replicas, as behind ``wrk -c64`` on the fast backend. 2,000 requests warm up first.
Each hook is timed with ``time.perf_counter_ns`` around its call; the figure is per
request, the round with the least total of ``--rounds`` (the machine's other work only
adds). It measures the policy's Python in a tight loop: inside the router the same code
costs about twice as much (its working set competes with the HTTP stack's for the
caches), and ``bench/peers.py`` measures that.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque

from policies.base import Decision, Outcome, ReplicaView, RequestView, Residency
from policies.registry import create

STEP_S = 0.0002
WARMUP = 2000


def per_request_us(policy_name: str, replicas: int, in_flight: int, n: int,
                   rounds: int, shuffled: bool = False) -> tuple[float, float, float]:
    """(choose, dispatched, observe) microseconds per request, the best round's;
    ``shuffled``: the request observed is any of those in flight (seeded), not the oldest."""
    policy = create(policy_name, None)
    rng = random.Random(0)
    views = [ReplicaView(id=f"r{i}", url=f"http://r{i}") for i in range(replicas)]
    residency = Residency(chain_blocks=1, gpu={v.id: 1 for v in views})
    out: deque[tuple[RequestView, Decision]] = deque()
    spent = [0, 0, 0]
    clock = time.perf_counter_ns

    def step(i: int) -> None:
        now = i * STEP_S
        view = RequestView(request_id=f"q{i}", model="m", session=f"s{i % 50}",
                           prompt_tokens=3, max_tokens=16, residency=residency, now=now)
        t0 = clock()
        decision = policy.choose(view, views)
        t1 = clock()
        policy.dispatched(view, decision)
        spent[0] += t1 - t0
        spent[1] += clock() - t1
        out.append((view, decision))
        if len(out) > in_flight:
            if shuffled:  # swap a random one to the front: replies in any order
                k = rng.randrange(len(out))
                out[0], out[k] = out[k], out[0]
            first, chosen = out.popleft()
            outcome = Outcome(first, chosen, ok=True, ttft_s=now - first.now,
                              total_s=now - first.now, at=now)
            t0 = clock()
            policy.observe(outcome)
            spent[2] += clock() - t0

    for i in range(WARMUP):
        step(i)
    best: tuple[float, float, float] | None = None
    for r in range(rounds):
        spent[:] = [0, 0, 0]
        for i in range(WARMUP + r * n, WARMUP + (r + 1) * n):
            step(i)
        got = (spent[0] / n / 1e3, spent[1] / n / 1e3, spent[2] / n / 1e3)
        if best is None or sum(got) < sum(best):
            best = got
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", nargs="+", default=["locality", "prefix_affinity",
                                                       "round_robin"])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--n", type=int, default=5000, help="requests per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shuffled", action="store_true",
                    help="observe any request in flight, not the oldest: first tokens out of "
                         "order, as from a batching engine or wrk's fast backends")
    args = ap.parse_args()
    print("| policy | choose (us) | dispatched (us) | observe (us) | total (us) |")
    print("|---|---|---|---|---|")
    for name in args.policies:
        c, d, o = per_request_us(name, args.replicas, args.in_flight, args.n, args.rounds,
                                 args.shuffled)
        print(f"| {name} | {c:.1f} | {d:.1f} | {o:.1f} | {c + d + o:.1f} |")


if __name__ == "__main__":
    main()
