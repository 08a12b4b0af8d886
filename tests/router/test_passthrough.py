"""Pass-through fidelity: bytes unchanged, SSE flushed as it arrives, headers handled."""

from __future__ import annotations

import time

import httpx
from servers import Server, replica, router

from router.upstream import request_headers

BODY = {"model": "emulated-27b", "messages": [{"role": "user", "content": "stream me"}],
        "max_tokens": 12, "stream": True, "stream_options": {"include_usage": True}}


def test_stream_bytes_identical_to_direct(start_servers, two_replicas: list[Server]) -> None:
    lm = start_servers(router([two_replicas[0].url]))
    headers = {"x-request-id": "fidelity-1"}
    direct = httpx.post(two_replicas[0].url + "/v1/chat/completions", json=BODY, headers=headers)
    routed = httpx.post(lm.url + "/v1/chat/completions", json=BODY, headers=headers)
    assert routed.status_code == direct.status_code == 200
    assert routed.content == direct.content
    assert routed.content.endswith(b"data: [DONE]\n\n")
    assert routed.headers["content-type"] == direct.headers["content-type"]
    assert routed.headers["x-request-id"] == "fidelity-1"
    # One Date header: the replica's passes through, the router adds none of its own.
    assert len(routed.headers.get_list("date")) == 1


def test_non_stream_bytes_identical(start_servers, two_replicas: list[Server]) -> None:
    lm = start_servers(router([two_replicas[1].url]))
    body = {**BODY, "stream": False}
    headers = {"x-request-id": "fidelity-2"}
    direct = httpx.post(two_replicas[1].url + "/v1/chat/completions", json=body, headers=headers)
    routed = httpx.post(lm.url + "/v1/chat/completions", json=body, headers=headers)
    assert routed.content == direct.content
    assert routed.headers["content-length"] == str(len(direct.content))


def test_request_id_created_when_absent(start_servers, two_replicas: list[Server]) -> None:
    lm = start_servers(router([two_replicas[0].url]))
    r = httpx.post(lm.url + "/v1/chat/completions", json={**BODY, "stream": False})
    rid = r.headers["x-request-id"]
    assert len(rid) == 32
    assert r.json()["id"] == f"chatcmpl-{rid}"  # the replica got the same id


def test_sse_chunks_flushed_as_they_arrive(start_servers) -> None:
    slow = start_servers(replica("--tpot", "0.25"))
    lm = start_servers(router([slow.url]))
    arrivals: list[float] = []
    t0 = time.monotonic()
    with httpx.stream("POST", lm.url + "/v1/completions",
                      json={"model": "emulated-27b", "prompt": "x", "max_tokens": 5,
                            "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.monotonic() - t0)
    assert len(arrivals) == 6  # 5 tokens + [DONE]
    # Tokens are 0.25 s apart at the replica; a buffering proxy would deliver them together.
    assert arrivals[0] < 0.5
    assert arrivals[-1] - arrivals[0] > 0.8


def test_hop_by_hop_headers_stripped() -> None:
    """Names in any case (ASGI does not require servers to lower them), hop-by-hop ones and
    those a Connection header names dropped, and the caller's own list."""
    headers = [(b"Connection", b"keep-alive, X-Private"), (b"X-Private", b"1"), (b"TE", b"trailers"),
               (b"Transfer-Encoding", b"chunked"), (b"Authorization", b"Bearer k"),
               (b"Content-Type", b"application/json"), (b"Host", b"a"), (b"Upgrade", b"h2c"),
               (b"X-Request-Id", b"theirs")]
    assert request_headers(headers, drop=frozenset({b"x-request-id"})) == [
        (b"authorization", b"Bearer k"), (b"content-type", b"application/json")]
