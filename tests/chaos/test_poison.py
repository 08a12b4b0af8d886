"""Failures that are the request's fault never eject replicas."""

from __future__ import annotations

import httpx
from chaos import chat, metric, run_fire
from servers import replica, router

POISON = "poison-pill"


def test_poison_requests_eject_nobody(start_servers) -> None:
    reps = [start_servers(replica()) for _ in range(3)]
    lm = start_servers(router([r.url for r in reps], "--policy", "round_robin",
                              "--eject-after", "2", "--health-interval-s", "0.2"))
    for r in reps:
        httpx.post(r.url + "/_emulator/faults", json={"poison": POISON})
    bodies = [chat(f"valid {i}") for i in range(40)]
    for i in range(0, 40, 10):
        bodies.insert(i, chat(f"{POISON} {i}"))
    replies = run_fire(lm.url + "/v1/chat/completions", bodies, concurrency=4)
    bad = [r for r, b in zip(replies, bodies, strict=True) if POISON in str(b)]
    good = [r for r, b in zip(replies, bodies, strict=True) if POISON not in str(b)]
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in good)
    for r in bad:
        assert isinstance(r, httpx.Response) and r.status_code == 500
        err = r.json()["error"]  # the replica's plain text reaches the client shaped
        assert err["code"] == "upstream_500" and "Internal Server Error" in err["message"]
    state = httpx.get(lm.url + "/replicas").json()["replicas"]
    assert all(r["healthy"] and r["consecutive_failures"] == 0 for r in state)
    # Each poison request was tried on two replicas, not on every one.
    assert metric(lm.url, "lmroute_retries_total") == len(bad)


def test_json_500_is_not_a_replica_failure(start_servers) -> None:
    a, b = start_servers(replica()), start_servers(replica())
    lm = start_servers(router([a.url, b.url], "--policy", "round_robin", "--eject-after", "1",
                              "--expose-replica-header"))
    for r in (a, b):  # both answer vLLM's JSON 500: the engine is alive and said why
        httpx.post(r.url + "/_emulator/faults", json={"http_status": 500})
    for _ in range(4):
        r = httpx.post(lm.url + "/v1/chat/completions", json=chat("x"))
        assert r.status_code == 500 and r.json()["error"]["message"] == "emulated engine fault"
    assert all(r["healthy"] for r in httpx.get(lm.url + "/replicas").json()["replicas"])


def test_ejection_cap_keeps_half_the_fleet(start_servers) -> None:
    reps = [start_servers(replica()) for _ in range(4)]
    # Four attempts: a request may meet all three dead replicas before the live one.
    lm = start_servers(router([r.url for r in reps], "--policy", "round_robin",
                              "--eject-after", "1", "--health-interval-s", "30",
                              "--max-attempts", "4"))
    for r in reps[:3]:  # three replicas die: connect errors are replica failures
        r.kill()
    replies = run_fire(lm.url + "/v1/chat/completions", [chat(f"v{i}") for i in range(12)],
                       concurrency=2)
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in replies)
    healthy = [r["healthy"] for r in httpx.get(lm.url + "/replicas").json()["replicas"]]
    assert healthy.count(False) == 2  # 50 % of 4: the third dead one was kept in


def test_plain_500_served_elsewhere_counts_against_its_replica(start_servers) -> None:
    a, b = start_servers(replica()), start_servers(replica())
    lm = start_servers(router([a.url, b.url], "--policy", "round_robin", "--eject-after", "100",
                              "--expose-replica-header"))
    httpx.post(a.url + "/_emulator/faults", json={"poison": POISON})  # only a fails it
    replies = [httpx.post(lm.url + "/v1/chat/completions", json=chat(f"{POISON} {i}"))
               for i in range(4)]
    assert [r.status_code for r in replies] == [200] * 4
    assert {r.headers["x-lmroute-replica"] for r in replies} == {b.url}
    fails = {r["url"]: r["consecutive_failures"]
             for r in httpx.get(lm.url + "/replicas").json()["replicas"]}
    assert fails[a.url] >= 1 and fails[b.url] == 0  # the 500 followed the replica
