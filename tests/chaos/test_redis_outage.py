"""The shared index goes down and comes back: requests never fail, the router says it is
degraded, and uses Redis again within a probe period of its return."""

from __future__ import annotations

import os
import signal

import httpx
from chaos import chat, metric, run_fire, wait_until
from servers import replica, router

LONG = "a shared document, long enough for several prefix blocks. " * 200


def _chat(text: str) -> dict[str, object]:
    return chat(LONG + text)


def test_redis_killed_and_restarted(start_servers, redis_server_factory) -> None:
    redis = redis_server_factory()
    reps = [start_servers(replica()) for _ in range(2)]
    lm = start_servers(router([r.url for r in reps], "--index", redis.url))
    url = lm.url + "/v1/chat/completions"
    first = run_fire(url, [_chat(f"before {i}") for i in range(20)], concurrency=4)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in first)
    assert metric(lm.url, "lmroute_index_degraded") == 0

    assert redis.pid is not None
    os.kill(redis.pid, signal.SIGKILL)  # a crash, not a shutdown
    redis.stop()
    during = run_fire(url, [_chat(f"during {i}") for i in range(40)], concurrency=4)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in during)
    assert metric(lm.url, "lmroute_index_degraded") == 1

    redis.start()  # same port, empty
    wait_until(lambda: metric(lm.url, "lmroute_index_degraded") == 0, timeout_s=3)
    after = run_fire(url, [_chat(f"after {i}") for i in range(20)], concurrency=4)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in after)

    import redis as redis_py

    client = redis_py.Redis.from_url(redis.url)
    try:  # the served prefixes were recorded in the restarted Redis again
        wait_until(lambda: bool(client.keys("*lmroute*")), timeout_s=3)
    finally:
        client.close()
