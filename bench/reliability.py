"""The figures of docs/reliability.md, measured with real processes on 127.0.0.1.

    poison      3 replicas that answer a plain-text 500 to any body containing a marker;
                ``--valid`` valid requests with ``--poison`` poison ones mixed in (8 in
                flight): replicas ejected, valid requests failed, poison answers' statuses
    disconnect  a client that gives up (a) on a non-streamed request, (b) on a stream before
                its first byte (3 s prefill), (c) mid-stream: seconds from the client's
                close to the replica counting the request ``finished_reason="abort"``
                (its /metrics polled every 5 ms), ``--repeat`` times each
    drain       100 streams in flight (40 tokens at 50 ms), SIGTERM to the router
                (``--drain-grace-s 1``): seconds to ``/ready`` 503 (polled as fast as it
                answers), streams completed, seconds to exit
    redis       the router's Redis killed (SIGKILL), requests served meanwhile, Redis
                restarted on its port: seconds from its restart to
                ``lmroute_index_degraded`` 0 (polled every 10 ms), ``--repeat`` times

Usage::

    .venv/bin/python bench/reliability.py [--only poison,disconnect,drain,redis]
        [--json out/reliability.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))
from chaos import chat, fire, metric, streams
from servers import Server, replica, router
from servers_redis import RedisServer


class Fleet:
    def __init__(self) -> None:
        self.servers: list[Server] = []

    def start(self, server: Server) -> Server:
        self.servers.append(server)
        return server.start()

    def stop(self) -> None:
        for s in reversed(self.servers):
            s.stop()


def poison(args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet()
    try:
        reps = [fleet.start(replica()) for _ in range(3)]
        lm = fleet.start(router([r.url for r in reps], "--no-access-log"))
        for r in reps:
            httpx.post(r.url + "/_emulator/faults", json={"poison": "poison-pill"})
        work = [chat(f"valid {i}") for i in range(args.valid)]
        step = max(1, args.valid // max(1, args.poison))
        for i in range(args.poison):
            work.insert(i * (step + 1), chat(f"poison-pill {i}"))
        replies = asyncio.run(fire(lm.url + "/v1/chat/completions", work, concurrency=8))
        valid_failed = sum(1 for r, b in zip(replies, work, strict=True)
                           if "poison-pill" not in str(b)
                           and not (isinstance(r, httpx.Response) and r.status_code == 200))
        statuses = sorted({r.status_code for r, b in zip(replies, work, strict=True)
                           if "poison-pill" in str(b) and isinstance(r, httpx.Response)})
        state = httpx.get(lm.url + "/replicas").json()["replicas"]
        return {"valid": args.valid, "poison": args.poison, "valid_failed": valid_failed,
                "poison_statuses": statuses, "replicas_ejected": sum(not r["healthy"]
                                                                     for r in state)}
    finally:
        fleet.stop()


def _abort_latency(rep: Server, lm: Server, phase: str) -> float:
    before = metric(rep.url, "vllm:request_success_total", finished_reason="abort")
    body = chat(f"{phase} {time.monotonic()}", max_tokens=200 if phase == "mid_stream" else 2,
                stream=phase != "buffered")
    if phase == "mid_stream":
        with httpx.stream("POST", lm.url + "/v1/chat/completions", json=body, timeout=10) as r:
            it = r.iter_bytes()
            next(it)
            next(it)
            closed = time.monotonic()
    else:
        with contextlib.suppress(httpx.ReadTimeout):
            httpx.post(lm.url + "/v1/chat/completions", json=body,
                       timeout=httpx.Timeout(5, read=0.3))
        closed = time.monotonic()
    while metric(rep.url, "vllm:request_success_total", finished_reason="abort") == before:
        if time.monotonic() - closed > 10:
            return float("inf")
        time.sleep(0.005)
    return time.monotonic() - closed


def disconnect(args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet()
    try:
        slow = fleet.start(replica("--ttft", "3", "--tpot", "0.05"))
        lm = fleet.start(router([slow.url], "--no-access-log"))
        out: dict[str, Any] = {}
        for phase in ("buffered", "before_first_byte", "mid_stream"):
            seconds = [_abort_latency(slow, lm, phase) for _ in range(args.repeat)]
            out[phase] = {"median_s": round(statistics.median(seconds), 4),
                          "max_s": round(max(seconds), 4), "n": len(seconds)}
        out["router_in_flight_after"] = sum(
            r["in_flight"] for r in httpx.get(lm.url + "/replicas").json()["replicas"])
        return out
    finally:
        fleet.stop()


def drain(args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet()
    try:
        rep = fleet.start(replica("--tpot", "0.05"))
        lm = fleet.start(router([rep.url], "--no-access-log", "--drain-grace-s", "1"))
        assert lm.proc is not None
        proc = lm.proc

        async def scenario() -> dict[str, Any]:
            started = asyncio.Event()
            held = asyncio.create_task(streams(lm.url, 100, started))
            await asyncio.wait_for(started.wait(), 60)
            async with httpx.AsyncClient(timeout=5) as client:
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                while (await client.get(lm.url + "/ready")).status_code != 503:
                    pass
                to_503 = time.monotonic() - t0
            texts = await held
            done = sum(t.endswith("data: [DONE]\n\n") for t in texts)
            await asyncio.to_thread(proc.wait, 60)
            return {"streams": 100, "streams_completed": done, "ready_503_after_s":
                    round(to_503, 4), "exited_after_s": round(time.monotonic() - t0, 2)}

        return asyncio.run(scenario())
    finally:
        fleet.stop()


def redis(args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet()
    server = RedisServer().start()
    try:
        reps = [fleet.start(replica()) for _ in range(2)]
        lm = fleet.start(router([r.url for r in reps], "--index", server.url, "--no-access-log"))
        url = lm.url + "/v1/chat/completions"
        back, failed = [], 0
        for round_ in range(args.repeat):
            assert server.pid is not None
            os.kill(server.pid, signal.SIGKILL)
            server.stop()
            long = "a shared document, long enough for several prefix blocks. " * 200
            replies = asyncio.run(fire(url, [chat(f"{long} r{round_} {i}") for i in range(50)]))
            failed += sum(not (isinstance(r, httpx.Response) and r.status_code == 200)
                          for r in replies)
            server.start()
            t0 = time.monotonic()
            while metric(lm.url, "lmroute_index_degraded") != 0:
                time.sleep(0.01)
            back.append(time.monotonic() - t0)
        return {"outages": args.repeat, "requests_failed_during": failed,
                "back_in_use_median_s": round(statistics.median(back), 3),
                "back_in_use_max_s": round(max(back), 3)}
    finally:
        fleet.stop()
        server.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="poison,disconnect,drain,redis")
    ap.add_argument("--valid", type=int, default=1000)
    ap.add_argument("--poison", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    runs = {"poison": poison, "disconnect": disconnect, "drain": drain, "redis": redis}
    result = {name: runs[name](args) for name in args.only.split(",")}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
