"""The replica hop's own HTTP/1.1 client (router.wire, router.wire_pool) against real
sockets: an emulated replica for the happy paths, and small raw TCP servers on 127.0.0.1
that answer the way broken or unusual servers do (what no well-behaved server shows)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest
from servers import replica, sse_data

from router.errors import UpstreamConnectError, UpstreamStreamBroken
from router.upstream import Upstream
from router.wire_pool import WirePool

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def _against(handler: Handler, read_timeout_s: float = 5,
                   keepalive_s: float = 4) -> AsyncIterator[tuple[WirePool, str]]:
    """A pool of our own and the URL of a raw server answering with ``handler``."""
    server, url = await _serve(handler)
    pool = WirePool(1, read_timeout_s, keepalive_s)
    try:
        yield pool, url
    finally:
        pool.close()
        server.close()


async def _head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def _drain(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([c async for c in chunks])


async def test_emulated_replica_streams_and_reuses_one_connection(start_servers) -> None:
    rep = start_servers(replica())
    up = Upstream(3, 30)
    await up.start()
    try:
        body = (b'{"model":"emulated-27b","prompt":"hello","max_tokens":4,"stream":true}')
        for _ in range(3):
            resp = await up.send("POST", rep.url + "/v1/completions",
                                 [(b"content-type", b"application/json")], body)
            assert resp.status == 200 and resp.is_event_stream
            events = (await _drain(resp.chunks())).split(b"\n\n")
            assert events[-2] == b"data: [DONE]" and len(events) == 6
        resp = await up.send("GET", rep.url + "/v1/models", [], None)
        assert b"emulated-27b" in await resp.read()
        assert up._wire is not None and len(up._wire.open) == 1  # one keep-alive connection
    finally:
        await up.close()


async def test_close_delimited_body_and_connection_close_are_honoured() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        writer.write(b"part two")
        writer.close()

    async with _against(handler) as (pool, url):
        for _ in range(2):  # the first connection is closed, not reused: a second one opens
            resp = await pool.send("GET", url + "/x", [], None)
            assert await resp.read() == b"part one, part two"
        assert not pool.idle


async def test_interim_replies_are_skipped() -> None:
    async def early(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
                     b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\nx-real: 1\r\n\r\ndone")

    async with _against(early) as (pool, url):
        resp = await pool.send("POST", url + "/", [(b"expect", b"100-continue")], b"{}")
        assert resp.status == 201 and resp.raw_headers == [(b"content-length", b"4"),
                                                           (b"x-real", b"1")]
        assert await resp.read() == b"done"


async def test_refused_and_malformed_replies_are_connect_errors() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()

    server, url = await _serve(garbage)
    pool = WirePool(1, 5, 4)
    try:
        with pytest.raises(UpstreamConnectError, match="malformed"):
            await pool.send("POST", url + "/v1/completions", [], b"{}")
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamConnectError, match="unreachable"):
            await pool.send("POST", url + "/v1/completions", [], b"{}")
    finally:
        pool.close()


async def test_a_body_cut_short_breaks_the_stream() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\nf\r\ndata: one....\n\n\r\n")
        await writer.drain()
        writer.transport.abort()  # no terminating chunk

    async with _against(cut) as (pool, url):
        resp = await pool.send("POST", url + "/", [], b"{}")
        got = []
        with pytest.raises(UpstreamStreamBroken):
            async for chunk in resp.chunks():
                got.append(chunk)
        assert got == [b"data: one....\n\n"]


async def test_read_timeout_counts_between_reads_not_from_the_start() -> None:
    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(4):  # 4 x 0.2 s: longer than the timeout in all, shorter between reads
            await asyncio.sleep(0.2)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
        await asyncio.sleep(1.0)  # now a silence longer than the timeout
        writer.write(b"0\r\n\r\n")

    async with _against(slow, read_timeout_s=0.5) as (pool, url):
        resp = await pool.send("GET", url + "/", [], None)
        got = []
        with pytest.raises(UpstreamStreamBroken, match="no bytes"):
            async for chunk in resp.chunks():
                got.append(chunk)
        assert b"".join(got) == b"xxxx"


async def test_the_limit_makes_room_by_closing_an_idle_connection() -> None:
    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await _head(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
            await asyncio.sleep(0.3)  # the connection is busy until its reply ends
            writer.write(b"ok")

    a, url_a = await _serve(ok)
    b, url_b = await _serve(ok)
    pool = WirePool(1, 5, 4, limit=1)
    try:
        assert await (await pool.send("GET", url_a + "/", [], None)).read() == b"ok"
        assert await (await pool.send("GET", url_b + "/", [], None)).read() == b"ok"
        b_key = ("127.0.0.1", b.sockets[0].getsockname()[1])
        assert len(pool.open) == 1 and [k for k, v in pool.idle.items() if v] == [b_key]
        # At the limit with nothing idle: the second request waits for the first to end.
        first = await pool.send("GET", url_a + "/", [], None)
        waiting = asyncio.ensure_future(pool.send("GET", url_b + "/", [], None))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        assert await first.read() == b"ok"
        assert await (await asyncio.wait_for(waiting, 2)).read() == b"ok"
    finally:
        pool.close()
        a.close()
        b.close()


async def test_idle_connections_are_closed_by_the_router_after_keepalive() -> None:
    closed = asyncio.Event()

    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await reader.read()  # EOF: the client closed
        closed.set()

    async with _against(ok, keepalive_s=0.4) as (pool, url):
        await (await pool.send("GET", url + "/", [], None)).read()
        assert len(pool.open) == 1
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(closed.wait(), 2)
        assert asyncio.get_running_loop().time() - t0 > 0.35  # not before keepalive_s
        assert not pool.open and not pool.idle


async def test_a_slow_consumer_pauses_the_replica_socket() -> None:
    sent = 0

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await _head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        for _ in range(1024):  # 64 MiB offered
            writer.write(b"10000\r\n" + piece + b"\r\n")
            await writer.drain()
            sent += len(piece)
        writer.write(b"0\r\n\r\n")

    async with _against(firehose) as (pool, url):
        resp = await pool.send("GET", url + "/", [], None)
        chunks = resp.chunks()
        await chunks.__anext__()
        await asyncio.sleep(0.5)  # nobody reads: the sender must be held back by TCP
        assert sent < 24 * 2**20  # HIGH_WATER plus what the kernel's buffers hold
        rest = await _drain(chunks)
        assert sent == 64 * 2**20 and len(rest) > 0


def test_router_relays_through_the_wire_client(start_servers) -> None:
    from servers import router

    rep = start_servers(replica())
    lm = start_servers(router([rep.url]))
    with httpx.stream("POST", lm.url + "/v1/chat/completions", timeout=10,
                      json={"model": "emulated-27b", "stream": True, "max_tokens": 3,
                            "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        assert r.headers["x-lmroute-replica"] == "r0"
        body = b"".join(r.iter_bytes())
    assert body.endswith(b"data: [DONE]\n\n")


def test_a_slow_client_gets_every_event_in_order(start_servers) -> None:
    """A stream far larger than the sockets' buffers, read by a client that stalls: the
    router's direct forwarding (router.forward) must fall back to a task, pause the
    replica's socket and deliver everything, in order, exactly as the replica sent it."""
    import socket
    import time

    from servers import router

    rep = start_servers(replica("--ttft", "0", "--tpot", "0"))
    lm = start_servers(router([rep.url]))
    body = {"model": "emulated-27b", "prompt": "tell me everything", "max_tokens": 30000,
            "stream": True, "ignore_eos": True}
    direct = httpx.post(rep.url + "/v1/completions", json=body, timeout=60).content

    host, port = lm.url.removeprefix("http://").split(":")
    payload = httpx.Request("POST", lm.url + "/v1/completions", json=body)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload.content)}\r\nconnection: close\r\n\r\n").encode()
    sock.sendall(head + payload.content)
    time.sleep(2.0)  # stall: the router's writes must back up
    raw = bytearray()
    while chunk := sock.recv(65536):
        raw += chunk
    sock.close()
    relayed = _dechunk(bytes(raw).split(b"\r\n\r\n", 1)[1])

    def texts(stream: bytes) -> list[str]:
        import json as _json
        return [_json.loads(e)["choices"][0]["text"] for e in sse_data(stream)]

    assert len(direct) > 4 * 2**20  # larger than what the kernel buffers between us
    assert texts(relayed) == texts(direct)


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        j = data.index(b"\r\n", i)
        size = int(data[i:j], 16)
        if size == 0:
            return bytes(out)
        out += data[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def test_a_connection_closed_under_us_is_never_written_to() -> None:
    """A replica killed under load: uvloop closes a reset socket's handle at once and calls
    ``connection_lost`` on a later turn of the loop. A request taken from the pool in
    between was written to the closed handle, uvloop raised RuntimeError, and a client
    got a 500 (``tests/chaos/test_replica_killed.py`` on a fast host). Such an idle
    connection is skipped; a write that fails anyway is a connect error, which the
    router retries on another replica (nothing was sent)."""
    uvloop = pytest.importorskip("uvloop")  # installed with uvicorn[standard]: the router's loop

    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await _head(reader)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    async def scenario() -> None:
        async with _against(ok) as (pool, url):
            assert await (await pool.send("GET", url + "/", [], None)).read() == b"ok"
            [stale] = [c for idle in pool.idle.values() for c in idle]
            assert stale.transport is not None
            stale.transport.abort()  # closed now; connection_lost comes later
            assert stale.closing() and not stale.closed
            # From the pool: skipped, and a new connection carries the request.
            assert await (await pool.send("GET", url + "/", [], None)).read() == b"ok"
            assert stale not in pool.open
            # Written anyway (the check and the write are one turn apart elsewhere).
            stale.start(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", 5)
            assert stale.head is not None
            with pytest.raises(UpstreamConnectError, match="replica closed the connection"):
                await stale.head

    uvloop.run(scenario())
