"""A client that disconnects cancels its upstream request, in every phase."""

from __future__ import annotations

import httpx
import pytest
from chaos import chat, in_flight, metric, run_fire, wait_until
from servers import replica, router


def _aborted(replica_url: str) -> float:
    return metric(replica_url, "vllm:request_success_total", finished_reason="abort")


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_before_first_byte_aborts_upstream(start_servers, stream: bool) -> None:
    a = start_servers(replica("--ttft", "3"))
    lm = start_servers(router([a.url]))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(lm.url + "/v1/chat/completions", json=chat("slow", stream=stream),
                   timeout=httpx.Timeout(5, read=0.5))
    wait_until(lambda: _aborted(a.url) == 1, timeout_s=2.5)  # well before the 3 s prefill
    assert in_flight(lm.url) == 0
    assert metric(lm.url, "lmroute_client_disconnects_total", phase="before_reply") == 1
    assert httpx.post(lm.url + "/v1/chat/completions", json=chat("after"),
                      timeout=10).status_code == 200


def test_disconnect_mid_stream_aborts_upstream(start_servers) -> None:
    a = start_servers(replica("--tpot", "0.05"))
    lm = start_servers(router([a.url]))
    with httpx.stream("POST", lm.url + "/v1/chat/completions", timeout=10,
                      json=chat("long", max_tokens=200, stream=True)) as r:
        chunks = r.iter_bytes()
        next(chunks)
        next(chunks)
    wait_until(lambda: _aborted(a.url) == 1, timeout_s=3)  # not after the 10 s stream
    assert in_flight(lm.url) == 0
    assert metric(lm.url, "lmroute_client_disconnects_total", phase="mid_stream") == 1


def test_disconnect_storm_leaves_nothing_in_flight(start_servers) -> None:
    reps = [start_servers(replica("--ttft", "1")) for _ in range(2)]
    lm = start_servers(router([r.url for r in reps]))
    bodies = [chat(f"storm {i}", stream=i % 2 == 0) for i in range(60)]
    replies = run_fire(lm.url + "/v1/chat/completions", bodies, concurrency=60,
                       timeout_s=0.3)
    assert all(isinstance(r, httpx.TimeoutException) for r in replies)

    def settled() -> bool:  # nothing left running or queued on the replicas
        return sum(metric(r.url, "vllm:num_requests_running")
                   + metric(r.url, "vllm:num_requests_waiting") for r in reps) == 0

    wait_until(settled, timeout_s=5)
    # A request the router saw after its client had already gone never reached a replica;
    # every one that did was aborted, none ran to its end.
    aborted = sum(_aborted(r.url) for r in reps)
    finished = sum(metric(r.url, "vllm:request_success_total", finished_reason="length")
                   for r in reps)
    gone = metric(lm.url, "lmroute_client_disconnects_total")
    assert finished == 0 and 0 < aborted <= gone <= 60
    assert in_flight(lm.url) == 0
    ok = run_fire(lm.url + "/v1/chat/completions", [chat(f"v{i}") for i in range(10)])
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in ok)
