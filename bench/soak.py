"""Soak: N requests through a real router in front of emulated replicas; what failed, how
fast, and how the router's memory moved.

Starts ``--replicas`` emulated replicas (``lmroute replica``, no prefill time, ``--tpot``
per token) and one router (``lmroute serve``, default policy, ``--drain-grace-s 0``) as
subprocesses on 127.0.0.1, sends a warm-up of 200 requests, reads the router's RSS
(``/proc/PID/status`` VmRSS), then sends ``--requests`` requests (``--concurrency`` in
flight; every ``--stream-every``-th streamed; prompts drawn from ``--sessions`` chats that
grow by one turn each time, so prefixes repeat as in real traffic) and reads RSS again.
Prints (and with ``--json`` writes) failed count, req/s, RSS before/after and growth per
request. A request fails when it raises or answers other than 200 (a stream must end with
``[DONE]``).

Usage::

    .venv/bin/python bench/soak.py --requests 20000 [--concurrency 32] [--json out/soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from servers import Server, replica, router
from upstream_clients import rss_kib


def bodies(n: int, sessions: int, stream_every: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    turns = [0] * sessions
    out = []
    for i in range(n):
        s = rng.randrange(sessions)
        turns[s] += 1
        messages = [{"role": "system", "content": f"You are assistant {s}. " * 20}]
        for t in range(turns[s] % 12):
            messages.append({"role": "user", "content": f"question {t} of chat {s} " * 8})
            messages.append({"role": "assistant", "content": f"answer {t} " * 8})
        messages.append({"role": "user", "content": f"now {i}"})
        out.append({"model": "emulated-27b", "messages": messages, "max_tokens": 8,
                    "stream": stream_every > 0 and i % stream_every == 0})
    return out


async def send_all(url: str, work: list[dict[str, Any]], concurrency: int) -> Counter[str]:
    """Send every body; what failed, counted by status and the start of the error."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for body in work:
        queue.put_nowait(body)
    failed: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                try:
                    r = await client.post(url, json=body)
                    if r.status_code != 200:
                        failed[f"{r.status_code} {r.text[:160]}"] += 1
                    elif body["stream"] and not r.text.endswith("data: [DONE]\n\n"):
                        failed["stream without [DONE]: " + r.text[-160:]] += 1
                except httpx.HTTPError as exc:
                    failed[f"{type(exc).__name__}: {str(exc)[:160]}"] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--stream-every", type=int, default=4)
    ap.add_argument("--tpot", type=float, default=0.001)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    started: list[Server] = []
    try:
        reps = [replica("--tpot", str(args.tpot)).start() for _ in range(args.replicas)]
        started += reps
        lm = router([r.url for r in reps], "--no-access-log").start()
        started.append(lm)
        assert lm.proc is not None
        url = lm.url + "/v1/chat/completions"
        asyncio.run(send_all(url, bodies(200, args.sessions, args.stream_every, args.seed + 1),
                             args.concurrency))
        before = rss_kib(lm.proc.pid)
        work = bodies(args.requests, args.sessions, args.stream_every, args.seed)
        t0 = time.perf_counter()
        failed = asyncio.run(send_all(url, work, args.concurrency))
        elapsed = time.perf_counter() - t0
        after = rss_kib(lm.proc.pid)
    finally:
        for s in reversed(started):
            s.stop()
    result = {"requests": args.requests, "concurrency": args.concurrency,
              "replicas": args.replicas, "failed": sum(failed.values()),
              "errors": dict(failed.most_common(10)),
              "req_per_s": round(args.requests / elapsed, 1),
              "router_rss_kib_before": before, "router_rss_kib_after": after,
              "rss_bytes_per_request": round((after - before) * 1024 / args.requests, 1)}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
