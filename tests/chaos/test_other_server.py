"""The router's app served by another ASGI server (granian, ``router.asgi:app``): replies,
streams and client disconnects as under ``lmroute serve``.

The request path steps the server's ``receive()`` and ``send()`` by hand (router.disconnect,
router.forward). uvicorn's are coroutines; granian's return awaitables that are not. Before
they were wrapped (``steppable``), with the access log off a stream broke at its second
read (``AttributeError: ... no attribute 'send'``), and with it on (its middleware's send
is a coroutine) a client leaving was never seen: each case below failed. A real granian
process on 127.0.0.1, in front of a real emulated replica.
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import orjson
import pytest
from chaos import chat, in_flight, metric, wait_until
from servers import Server, free_port, replica, sse_data


def granian(backend: str, access_log: bool = False) -> Server:
    port = free_port()
    args = ["--interface", "asgi", "--loop", "uvloop", "--workers", "1", "--no-ws",
            "--host", "127.0.0.1", "--port", str(port), "router.asgi:app"]
    return Server(args, port, module="granian", name="granian",
                  env={"LMROUTE_BACKENDS": backend, "LMROUTE_POLICY": "locality",
                       "LMROUTE_ACCESS_LOG": str(access_log).lower()})


def _texts(stream: bytes) -> list[str]:
    return [orjson.loads(e)["choices"][0]["delta"].get("content", "") for e in sse_data(stream)]


@pytest.mark.parametrize("access_log", [False, True])  # on: our middleware wraps send
def test_replies_and_streams_as_the_replica_sends_them(start_servers, access_log: bool) -> None:
    rep = start_servers(replica("--ttft", "0.02", "--tpot", "0.01"))  # a read per event
    lm = start_servers(granian(rep.url, access_log))
    body = chat("count the stars", max_tokens=30, ignore_eos=True)
    direct = httpx.post(rep.url + "/v1/chat/completions", json=body, timeout=10).json()
    routed = httpx.post(lm.url + "/v1/chat/completions", json=body, timeout=10)
    assert routed.status_code == 200
    assert routed.json()["choices"][0]["message"] == direct["choices"][0]["message"]
    streamed = {**body, "stream": True}
    want = _texts(httpx.post(rep.url + "/v1/chat/completions", json=streamed, timeout=10).content)
    got = _texts(httpx.post(lm.url + "/v1/chat/completions", json=streamed, timeout=10).content)
    assert got == want and len(want) >= 30
    bad = httpx.post(lm.url + "/v1/chat/completions", content=b"{", timeout=10)
    assert bad.status_code == 400 and "error" in bad.json()
    assert in_flight(lm.url) == 0


@pytest.mark.parametrize("access_log", [False, True])
def test_disconnect_mid_stream_aborts_upstream(start_servers, access_log: bool) -> None:
    rep = start_servers(replica("--tpot", "0.05"))
    lm = start_servers(granian(rep.url, access_log))
    with httpx.stream("POST", lm.url + "/v1/chat/completions", timeout=10,
                      json=chat("long", max_tokens=200, stream=True)) as r:
        chunks = r.iter_bytes()
        next(chunks)
        next(chunks)
    wait_until(lambda: metric(rep.url, "vllm:request_success_total",
                              finished_reason="abort") == 1, timeout_s=3)  # not after 10 s
    assert in_flight(lm.url) == 0


def test_no_backend_is_a_clear_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMROUTE_")}
    done = subprocess.run([sys.executable, "-c", "import router.asgi"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "LMROUTE_BACKENDS" in done.stderr and "Traceback" not in done.stderr
