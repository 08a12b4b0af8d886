"""A response's head goes to the client's socket in one write with the body sent right
after it (router.held_head), and is never held back waiting for a body that is late.

The router runs in this process (a real uvicorn server with the CLI's protocol, on
127.0.0.1, in front of a real emulated replica in its own process). The protocol is the
CLI's with one addition for the test: the connection's transport is wrapped to record
each write the server makes on the client's socket, and when.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from servers import Server, replica
from servers_redis import free_port

from router.app import create_app
from router.framing import JsonFramingProtocol
from router.settings import Settings

WRITES: list[tuple[float, bytes]] = []
FAKE_ENGINE = Path(__file__).resolve().parents[2] / "bench" / "fake_backend.py"


class Recording:
    """The client socket's transport, with each write recorded."""

    def __init__(self, inner: Any):
        self.inner = inner

    def write(self, data: bytes) -> None:
        WRITES.append((time.monotonic(), bytes(data)))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RecordingProtocol(JsonFramingProtocol):
    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = Recording(self.transport)  # type: ignore[assignment]


@contextmanager
def slow_first_event(delay_s: float) -> Iterator[str]:
    """bench/fake_backend.py, which (as vLLM) sends a stream's head at once and its
    events ``delay_s`` apart, the first one ``delay_s`` after the head."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "--host", "127.0.0.1",
                             "--port", str(port), "--tokens", "2", "--token-delay", str(delay_s)])
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(url + "/health", timeout=1.0)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "no fake engine"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@asynccontextmanager
async def router(backend: str) -> AsyncIterator[str]:
    app = create_app(Settings(backends=(backend,), policy="round_robin"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on",
                                           log_level="warning", http=RecordingProtocol))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_head_and_body_in_one_write(start_servers: Callable[[Server], Server]) -> None:
    rep = start_servers(replica("--ttft", "0.01", "--tpot", "0.001"))
    body = {"model": "emulated-27b", "prompt": "count the stars", "max_tokens": 8}
    async with router(rep.url) as url, httpx.AsyncClient(timeout=30.0) as client:
        for _ in range(3):  # the later ones on a kept-alive connection
            WRITES.clear()
            reply = await client.post(url + "/v1/completions", json=body)
            assert reply.status_code == 200
            assert len(reply.json()["choices"][0]["text"]) > 0
            # One write: the status line, the headers and the whole body.
            assert len(WRITES) == 1, [w[:40] for _, w in WRITES]
            data = WRITES[0][1]
            assert data.startswith(b"HTTP/1.1 200 OK\r\n")
            assert data.endswith(reply.content)
        WRITES.clear()  # an error answered by the router itself: also one write
        bad = await client.post(url + "/v1/completions", content=b"{not json")
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        assert len(WRITES) == 1 and WRITES[0][1].endswith(bad.content)
        # HEAD: uvicorn writes no body, so the held head must go out on its own.
        WRITES.clear()
        head = await client.head(url + "/v1/models", timeout=5.0)
        assert head.status_code == 200 and head.headers["content-length"] != "0"
        assert len(WRITES) == 1 and WRITES[0][1].endswith(b"\r\n\r\n")


async def test_stream_head_not_held_for_a_late_first_event() -> None:
    body = {"model": "fake-model", "prompt": "count the stars", "max_tokens": 2, "stream": True}
    with slow_first_event(1.0) as engine:
        async with router(engine) as url, httpx.AsyncClient(timeout=30.0) as client:
            WRITES.clear()
            t0 = time.monotonic()
            async with client.stream("POST", url + "/v1/completions", json=body) as reply:
                heads = time.monotonic() - t0
                assert reply.status_code == 200
                text = b"".join([chunk async for chunk in reply.aiter_bytes()])
            assert text.rstrip().endswith(b"data: [DONE]")
    # The client had the head long before the first event (1 s at the replica).
    assert heads < 0.5, heads
    assert WRITES[0][1].startswith(b"HTTP/1.1 200 OK\r\n") and WRITES[0][1].endswith(b"\r\n\r\n")
    assert WRITES[1][0] - WRITES[0][0] > 0.5  # the head was written alone, at once
    # each event a write of its own, as it arrived: 2 events, [DONE], the end
    assert len(WRITES) == 5, [w[:30] for _, w in WRITES]


async def test_100_continue_not_held(start_servers: Callable[[Server], Server]) -> None:
    """The first write of a request that expects ``100 Continue`` is that interim reply:
    the client waits for it before it sends its body, so it must not wait to be joined."""
    rep = start_servers(replica("--ttft", "0.01", "--tpot", "0.001"))
    payload = b'{"model": "emulated-27b", "prompt": "count the stars", "max_tokens": 4}'
    async with router(rep.url) as url:
        port = int(url.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(payload))
            await loop.run_in_executor(None, sock.sendall, head)
            interim = await loop.run_in_executor(None, sock.recv, 4096)
            assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim
            await loop.run_in_executor(None, sock.sendall, payload)
            reply = interim.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
            while b"}" not in reply.rpartition(b"\r\n\r\n")[2]:
                reply += await loop.run_in_executor(None, sock.recv, 65536)
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n"), reply[:60]


async def _raw_get(port: int) -> bytes:
    """GET / on a fresh connection; everything the server sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return data


async def test_held_head_on_late_body_and_on_failure() -> None:
    """An app (not the router's: a sized head, then an await, then the body; or a sized
    head, then an exception) under the router's protocol: the client gets what uvicorn
    alone would have sent it."""
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"5")]})
        if scope["path"] == "/fail":
            raise RuntimeError("the app broke after its head")
        await asyncio.sleep(0.2)
        await send({"type": "http.response.body", "body": b"hello"})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off",
                                           log_level="critical", http=RecordingProtocol))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        WRITES.clear()
        late = await _raw_get(port)
        assert late.startswith(b"HTTP/1.1 200 OK\r\n") and late.endswith(b"\r\n\r\nhello")
        assert len(WRITES) == 1  # the head waited for its body
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /fail HTTP/1.1\r\nhost: x\r\n\r\n")
        failed = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
        # uvicorn closes a connection whose app failed after the head: the head still went
        assert failed.startswith(b"HTTP/1.1 200 OK\r\n") and failed.endswith(b"\r\n\r\n")
    finally:
        server.should_exit = True
        await task
