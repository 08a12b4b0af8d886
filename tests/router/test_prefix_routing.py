"""The index on the request path: prefixes steer sessions, across routers sharing Redis."""

from __future__ import annotations

import time

import httpx
from servers import replica, router

MODEL = "emulated-27b"
# Several KiB of shared history: several 1 KiB prefix blocks.
DOCS = [f"Document {i}: " + " ".join(f"fact-{i}-{j}" for j in range(600)) for i in range(6)]


def turn(doc: str, n: int) -> dict[str, object]:
    msgs: list[dict[str, str]] = [{"role": "system", "content": doc}]
    for k in range(n):
        msgs += [{"role": "user", "content": f"question {k}"},
                 {"role": "assistant", "content": f"answer {k}"}]
    msgs.append({"role": "user", "content": f"question {n}"})
    return {"model": MODEL, "messages": msgs, "max_tokens": 3}


def _metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_for(url: str, name: str, at_least: float) -> None:
    deadline = time.monotonic() + 2
    while _metric(url, name) < at_least and time.monotonic() < deadline:
        time.sleep(0.02)


def test_prefix_affinity_follows_the_prefix_across_routers(start_servers, redis_url) -> None:
    reps = [start_servers(replica()), start_servers(replica())]
    urls = [r.url for r in reps]
    # A lookup slower than the adaptive bound (5 ms at first) falls back to the router's
    # own memory, which knows nothing of the other router: on a busy machine that is a
    # miss this test is not about, so the bound is wide here.
    slow_ok = ("--index-lookup-timeout-s", "1", "--index-lookup-timeout-max-s", "2")
    a = start_servers(router(urls, "--policy", "prefix_affinity", "--index", redis_url, *slow_ok))
    b = start_servers(router(urls, "--policy", "prefix_affinity", "--index", redis_url, *slow_ok))
    first = {}
    for i, doc in enumerate(DOCS):
        r = httpx.post(a.url + "/v1/chat/completions", json=turn(doc, 0),
                       headers={"x-session-id": f"a-{i}"})
        assert r.status_code == 200
        assert r.headers["x-lmroute-reason"] == "miss"
        first[i] = r.headers["x-lmroute-replica"]
    # Records are written in the background after each reply: wait until the shared
    # index has them (asked through router a, so b's lookup counters stay b's own).
    deadline = time.monotonic() + 10
    for doc in DOCS:
        while not httpx.post(a.url + "/index/lookup", json=turn(doc, 1)).json()["gpu"]:
            assert time.monotonic() < deadline, "the index never learnt the first turns"
            time.sleep(0.02)
    for i, doc in enumerate(DOCS):
        # Another router, another session id: only the shared index can know the prefix.
        r = httpx.post(b.url + "/v1/chat/completions", json=turn(doc, 1),
                       headers={"x-session-id": f"b-{i}"})
        assert r.headers["x-lmroute-reason"] == "gpu-hit"
        assert r.headers["x-lmroute-replica"] == first[i]
    assert _metric(b.url, 'lmroute_index_lookups_total{tier="gpu"}') == len(DOCS)


def test_memory_index_is_the_default(start_servers) -> None:
    reps = [start_servers(replica()), start_servers(replica())]
    lm = start_servers(router([r.url for r in reps], "--policy", "prefix_affinity"))
    r1 = httpx.post(lm.url + "/v1/chat/completions", json=turn(DOCS[0], 0))
    _wait_for(lm.url, 'lmroute_index_lookups_total{tier="miss"}', 1)
    time.sleep(0.1)
    r2 = httpx.post(lm.url + "/v1/chat/completions", json=turn(DOCS[0], 1),
                    headers={"x-session-id": "other"})
    assert r2.headers["x-lmroute-reason"] == "gpu-hit"
    assert r2.headers["x-lmroute-replica"] == r1.headers["x-lmroute-replica"]


def test_requests_flow_while_redis_is_down(start_servers, redis_server_factory) -> None:
    redis = redis_server_factory()
    reps = [start_servers(replica()), start_servers(replica())]
    lm = start_servers(router([r.url for r in reps], "--policy", "prefix_affinity",
                              "--index", redis.url))
    assert httpx.post(lm.url + "/v1/chat/completions", json=turn(DOCS[1], 0)).status_code == 200
    redis.stop()
    for k in range(1, 5):
        r = httpx.post(lm.url + "/v1/chat/completions", json=turn(DOCS[1], k))
        assert r.status_code == 200
    time.sleep(0.2)
    assert _metric(lm.url, "lmroute_index_errors_total") >= 1
    # The local fallback kept learning: the session still finds its prefix.
    r = httpx.post(lm.url + "/v1/chat/completions", json=turn(DOCS[1], 5),
                   headers={"x-session-id": "fresh"})
    assert r.headers["x-lmroute-reason"] == "gpu-hit"
