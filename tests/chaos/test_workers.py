"""``lmroute serve --workers 2``: workers stopped and killed under load are replaced, and
the load goes on (real processes: a router of two workers sharing a Redis index)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
from chaos import chat, fire, wait_until
from servers import Server, replica, router


def workers_of(server: Server) -> list[int]:
    assert server.proc is not None
    pid = server.proc.pid
    return sorted(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())


def replaced(server: Server, old: int, n: int = 2) -> bool:
    now = workers_of(server)
    return old not in now and len(now) == n


def test_two_workers_share_the_port_and_the_index(start_servers, redis_url: str) -> None:
    reps = [start_servers(replica("--tpot", "0.001")) for _ in range(2)]
    lm = start_servers(router([r.url for r in reps], "--workers", "2", "--index", redis_url,
                              "--policy", "locality"))
    assert len(workers_of(lm)) == 2
    body = chat("a shared prefix " * 200, max_tokens=2)
    replies = [httpx.post(lm.url + "/v1/chat/completions", json=body, timeout=30)
               for _ in range(6)]  # new connections: both workers serve some
    assert [r.status_code for r in replies] == [200] * 6
    # Every worker routes from the same index: after the first, all hit the same replica.
    assert len({r.headers["x-lmroute-replica"] for r in replies[1:]}) == 1


def test_a_worker_stopped_then_killed_under_load_loses_no_request(start_servers) -> None:
    reps = [start_servers(replica("--tpot", "0.002")) for _ in range(2)]
    # A drain grace: the stopped worker answers `connection: close` and keeps serving
    # for it, so clients leave its keep-alive connections before they are closed.
    lm = start_servers(router([r.url for r in reps], "--workers", "2", "--policy", "round_robin",
                              "--drain-grace-s", "0.5"))
    url = lm.url + "/v1/chat/completions"
    first, second = workers_of(lm)

    async def scenario() -> list[httpx.Response | Exception]:
        load = asyncio.create_task(fire(url, [chat(f"load {i}", max_tokens=4)
                                              for i in range(600)], concurrency=8))
        await asyncio.sleep(0.5)
        os.kill(first, signal.SIGTERM)  # graceful: drains, exits, is replaced
        await asyncio.to_thread(wait_until, lambda: replaced(lm, first), 20.0)
        await asyncio.sleep(0.3)
        os.kill(second, signal.SIGTERM)
        await asyncio.to_thread(wait_until, lambda: replaced(lm, second), 20.0)
        return await load

    t0 = time.monotonic()
    replies = asyncio.run(scenario())
    failed = [r for r in replies if not (isinstance(r, httpx.Response) and r.status_code == 200)]
    assert failed == [], failed[:3]
    assert time.monotonic() - t0 < 60
    assert first not in workers_of(lm) and second not in workers_of(lm)


def test_a_killed_worker_is_replaced_and_the_rest_serve(start_servers) -> None:
    """SIGKILL takes the requests that worker had in flight with it (nothing can answer
    them); the other worker goes on, and a fresh one replaces the dead."""
    reps = [start_servers(replica("--tpot", "0.001"))]
    lm = start_servers(router([r.url for r in reps], "--workers", "2"))
    victim = workers_of(lm)[0]
    os.kill(victim, signal.SIGKILL)
    replies = [httpx.post(lm.url + "/v1/chat/completions", json=chat(f"after {i}"), timeout=30)
               for i in range(10)]
    assert [r.status_code for r in replies] == [200] * 10
    wait_until(lambda: replaced(lm, victim), 20.0)
    lm.stop()  # SIGTERM to the parent stops every worker
