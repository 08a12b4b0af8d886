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
    # A lookup over the adaptive bound (5 ms at first) counts against Redis: on a busy
    # machine that alone can open the circuit before the outage this test is about.
    lm = start_servers(router([r.url for r in reps], "--index", redis.url,
                              "--index-lookup-timeout-s", "0.5",
                              "--index-lookup-timeout-max-s", "1"))
    url = lm.url + "/v1/chat/completions"
    first = run_fire(url, [_chat(f"before {i}") for i in range(20)], concurrency=4)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in first)
    # A write over its 50 ms bound still opens the circuit; with Redis up the next probe
    # (every 0.25 s) closes it.
    wait_until(lambda: metric(lm.url, "lmroute_index_degraded") == 0, timeout_s=3)

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
    served = iter(range(1000))

    def recorded_again() -> bool:
        # A write that times out on a busy machine (the fresh server's first connection)
        # reopens the circuit for a probe period and skips the writes behind it: so
        # requests go on being served until one's prefix lands in the restarted Redis.
        if client.keys("*lmroute*"):
            return True
        r = httpx.post(url, json=_chat(f"again {next(served)}"), timeout=10)
        assert r.status_code == 200
        return False

    try:  # the served prefixes are recorded in the restarted Redis again
        wait_until(recorded_again, timeout_s=10, every_s=0.05)
    finally:
        client.close()
