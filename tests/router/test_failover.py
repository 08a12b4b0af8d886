"""Failover: killed replicas, 5xx answers, broken streams, nothing healthy."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from servers import Server, replica, router

CHAT = {"model": "emulated-27b", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4}
FAST_HEALTH = ("--health-interval-s", "0.1", "--eject-after", "2", "--readmit-after", "2")


def _wait(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_killed_replica_requests_fail_over(start_servers) -> None:
    a, b = start_servers(replica()), start_servers(replica())
    lm = start_servers(router([a.url, b.url], "--policy", "round_robin", "--expose-replica-header",
                              "--health-interval-s", "30"))  # no probe: failover alone
    a.kill()
    replies = [httpx.post(lm.url + "/v1/chat/completions", json=CHAT) for _ in range(6)]
    assert [r.status_code for r in replies] == [200] * 6
    assert {r.headers["x-lmroute-replica"] for r in replies} == {b.url}
    metrics = httpx.get(lm.url + "/metrics").text
    assert f'lmroute_retries_total{{arm="",replica="{b.url}"}}' in metrics
    assert f'lmroute_upstream_errors_total{{arm="",kind="connect",replica="{a.url}"}}' in metrics
    # Two connect failures ejected a: later requests no longer try it at all.
    health = {r["url"]: r["healthy"] for r in httpx.get(lm.url + "/replicas").json()["replicas"]}
    assert health == {a.url: False, b.url: True}


def test_5xx_before_first_byte_retried_elsewhere(start_servers) -> None:
    a, b = start_servers(replica()), start_servers(replica())
    lm = start_servers(router([a.url, b.url], "--policy", "round_robin", "--eject-after", "100",
                              "--expose-replica-header"))
    httpx.post(a.url + "/_emulator/faults", json={"http_status": 500})
    replies = [httpx.post(lm.url + "/v1/chat/completions", json=CHAT) for _ in range(4)]
    assert [r.status_code for r in replies] == [200] * 4
    assert {r.headers["x-lmroute-replica"] for r in replies} == {b.url}


def test_all_replicas_5xx_passes_last_answer_through(start_servers) -> None:
    a = start_servers(replica())
    lm = start_servers(router([a.url], "--eject-after", "100"))
    httpx.post(a.url + "/_emulator/faults", json={"http_status": 503})
    r = httpx.post(lm.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "emulated engine fault"


def test_stream_broken_midway_ends_with_error_event(start_servers) -> None:
    a = start_servers(replica("--tpot", "0.01"))
    lm = start_servers(router([a.url]))
    httpx.post(a.url + "/_emulator/faults", json={"break_after_chunks": 2})
    r = httpx.post(lm.url + "/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 200  # the headers had gone out: no retry after bytes
    events = [e for e in r.text.split("\n\n") if e]
    assert len(events) == 4  # role chunk, 2 tokens, then the error event
    assert '"code":"upstream_stream_broken"' in events[-1]
    client = openai.OpenAI(base_url=lm.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(**{**CHAT, "stream": True}):
            pass
    # The router is fine afterwards and in-flight accounting came back to zero.
    httpx.post(a.url + "/_emulator/faults", json={})
    assert httpx.post(lm.url + "/v1/chat/completions", json=CHAT).status_code == 200
    assert httpx.get(lm.url + "/replicas").json()["replicas"][0]["in_flight"] == 0


def test_no_healthy_replica_gives_503_then_recovers(start_servers) -> None:
    a = start_servers(replica())
    lm = start_servers(router([a.url], *FAST_HEALTH))
    httpx.post(a.url + "/_emulator/faults", json={"health_status": 503})
    _wait(lambda: httpx.get(lm.url + "/ready").status_code == 503)
    r = httpx.post(lm.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_healthy_replica"
    httpx.post(a.url + "/_emulator/faults", json={})
    _wait(lambda: httpx.get(lm.url + "/ready").status_code == 200)
    assert httpx.post(lm.url + "/v1/chat/completions", json=CHAT).status_code == 200


def test_all_unreachable_gives_502(start_servers) -> None:
    a = start_servers(replica())
    lm = start_servers(router([a.url], "--health-interval-s", "30", "--eject-after", "100"))
    a.kill()
    r = httpx.post(lm.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "bad_gateway"


def test_fixed_keeps_sessions_when_a_replica_is_lost(start_servers) -> None:
    reps = [start_servers(replica()) for _ in range(3)]
    lm = start_servers(router([r.url for r in reps], "--policy", "fixed", *FAST_HEALTH,
                              "--expose-replica-header"))

    def placement() -> dict[str, str]:
        out = {}
        for i in range(30):
            r = httpx.post(lm.url + "/v1/chat/completions", json=CHAT,
                           headers={"x-session-id": f"s{i}"})
            assert r.status_code == 200
            assert r.headers["x-lmroute-reason"] in {"sticky", "failover"}
            out[f"s{i}"] = r.headers["x-lmroute-replica"]
        return out

    before = placement()
    assert before == placement()  # sticky
    assert len(set(before.values())) == 3  # and spread
    lost = reps[1]
    lost.kill()
    _wait(lambda: not httpx.get(lm.url + "/replicas").json()["replicas"][1]["healthy"])
    after = placement()
    for session, url in before.items():
        if url == lost.url:
            assert after[session] != lost.url
        else:
            assert after[session] == url  # only the lost replica's sessions moved


def test_alternating_moves_each_turn(start_servers, two_replicas: list[Server]) -> None:
    lm = start_servers(router([r.url for r in two_replicas], "--policy", "alternating"))
    seen = [httpx.post(lm.url + "/v1/chat/completions", json=CHAT,
                       headers={"x-session-id": "alt"}).headers["x-lmroute-replica"]
            for _ in range(4)]
    assert seen[0] != seen[1] and seen[0] == seen[2] and seen[1] == seen[3]
