"""Experiment: the keep-alive race, on both hops, with the old timeouts and the new.

An idle keep-alive connection is closed by whichever side's timer fires first. When the
server's fires first, a request the client writes at that moment meets a closed socket:
the client sees a reset (``ReadError``/``BrokenPipeError``), not a connect error it could
retry. Both of lmroute's hops had equal or inverted timers: clients (httpx, the OpenAI
SDK) expire idle connections after 5 s and uvicorn closed them after 5 s; vLLM (uvicorn)
closes after 5 s and the router's aiohttp pool kept them 15 s.

Set-up: ``--replicas`` emulated replicas (uvicorn's 5 s keep-alive, as vLLM) behind one
``lmroute serve``; ``--clients`` clients, each its own ``httpx.AsyncClient`` (one
connection, httpx's default 5 s expiry), send a small chat request, then sleep a time
drawn uniformly from ``[--gap-min, --gap-max]`` seconds, ``--rounds`` times. Gaps near
5 s put both hops' idle time at the edge. Each configuration (router ``--keep-alive-s``,
``--upstream-keepalive-s``) runs on fresh servers; reported: client-side failures (by
kind) and the router's ``lmroute_upstream_errors``/``lmroute_retries`` (an upstream
reset is retried on another replica, and counted against a healthy one).

Usage::

    .venv/bin/python bench/keepalive_race.py [--rounds 30] [--clients 48]
        [--json out/keepalive_race.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))
from chaos import metric
from servers import Server, replica, router

CONFIGS = {"old (5 s / 15 s)": ("5", "15"), "new (75 s / 4 s)": ("75", "4")}


async def clients(url: str, n: int, rounds: int, gaps: tuple[float, float],
                  seed: int) -> Counter[str]:
    failed: Counter[str] = Counter()
    rng = random.Random(seed)

    async def one(i: int) -> None:
        body = {"model": "emulated-27b", "max_tokens": 4,
                "messages": [{"role": "user", "content": f"client {i} says hello " * 4}]}
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.sleep(rng.uniform(0, gaps[1]))
            for _ in range(rounds):
                try:
                    r = await client.post(url, json=body)
                    if r.status_code != 200:
                        failed[f"HTTP {r.status_code}"] += 1
                except httpx.HTTPError as exc:
                    failed[type(exc).__name__] += 1
                await asyncio.sleep(rng.uniform(*gaps))

    await asyncio.gather(*(one(i) for i in range(n)))
    return failed


def run_config(keep_alive: str, upstream: str, args: argparse.Namespace) -> dict[str, Any]:
    started: list[Server] = []
    try:
        reps = [replica().start() for _ in range(args.replicas)]
        started += reps
        lm = router([r.url for r in reps], "--no-access-log", "--keep-alive-s", keep_alive,
                    "--upstream-keepalive-s", upstream).start()
        started.append(lm)
        failed = asyncio.run(clients(lm.url + "/v1/chat/completions", args.clients,
                                     args.rounds, (args.gap_min, args.gap_max), args.seed))
        upstream_errors = metric(lm.url, "lmroute_upstream_errors_total")
        retries = metric(lm.url, "lmroute_retries_total")
    finally:
        for s in reversed(started):
            s.stop()
    return {"keep_alive_s": float(keep_alive), "upstream_keepalive_s": float(upstream),
            "requests": args.clients * args.rounds, "client_failed": sum(failed.values()),
            "client_errors": dict(failed),
            "router_upstream_errors": upstream_errors, "router_retries": retries}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--gap-min", type=float, default=4.98)
    ap.add_argument("--gap-max", type=float, default=5.02)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = {}
    for name, (keep_alive, upstream) in CONFIGS.items():
        print(f"{name}: {args.clients} clients x {args.rounds} rounds ...", file=sys.stderr)
        results[name] = run_config(keep_alive, upstream, args)
        print(json.dumps(results[name]), file=sys.stderr)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
