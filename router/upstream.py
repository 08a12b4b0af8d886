"""The one HTTP client to replicas, with client errors mapped to ours at this boundary.

Contract (one method, like httpx's transport): ``send(method, url, headers, body)``
returns an ``UpstreamResponse`` once the replica's status line and headers arrived, or
raises ``UpstreamConnectError`` (nothing reached the client yet: the caller may retry on
another replica). The response's bytes are then read with ``read()`` (whole body) or
``chunks()`` (as they arrive, for SSE); a failure there raises ``UpstreamStreamBroken``.
Bytes are never decoded or re-encoded: ``auto_decompress`` is off, so a gzip body passes
through as gzip.

Idle connections: the side that closes an idle keep-alive connection must be the client,
or a request written just as the server's timer fires meets a closed socket (a reset, not a
retryable connect error). vLLM's server (uvicorn) closes idle connections after 5 s
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``) and aiohttp keeps them 15 s by default, so the pool
here drops them after ``keepalive_s`` (4 s by default, ``--upstream-keepalive-s``).

Clients: plain-http requests with a body in memory (nearly all traffic) go through
``router.wire_pool``, a small httptools-parsed client that costs a fraction of aiohttp's
Python per streamed read; https, streamed uploads and HEAD go through aiohttp's
ClientSession. Both give an ``UpstreamResponse``. docs/benchmarks.md ("Upstream HTTP
client", "The replica hop without aiohttp") has the measurements behind both choices
(bench/upstream_clients.py: httpx's default transport was far below aiohttp's throughput).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import yarl

from router.body_chunks import body_chunks
from router.errors import UpstreamConnectError, UpstreamStreamBroken
from router.wire_pool import WirePool

# RFC 9110 section 7.6.1: connection-specific headers a proxy must not forward; plus
# content-length/host, which the client library recomputes for each hop, and expect: the
# router has read the whole body already, so a 100-continue handshake with the replica
# would only cost a round trip (curl sends it for any body over 1 KiB).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
        "expect",
    }
)

HOP_BY_HOP_RAW = frozenset(name.encode() for name in HOP_BY_HOP)

_CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def end_to_end_raw(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Drop hop-by-hop headers (and any named in a Connection header) from raw headers
    whose names are lower case already."""
    items = list(headers)
    named = {token.strip().lower() for key, value in items if key == b"connection"
             for token in value.split(b",")}
    return [(k, v) for k, v in items if k not in HOP_BY_HOP_RAW and k not in named]


def request_headers(raw: Iterable[tuple[bytes, bytes]], *,
                    drop: frozenset[bytes] = frozenset()) -> list[tuple[bytes, bytes]]:
    """A client's raw request headers as forwarded to a replica: names in lower case (ASGI
    asks servers for it, without requiring it), hop-by-hop ones and those in ``drop``
    removed. Bytes throughout: the replica hop writes them as they came, instead of
    decoding each name and value and encoding it again."""
    return [(k, v) for k, v in end_to_end_raw((k.lower(), v) for k, v in raw)
            if k not in drop]


class UpstreamResponse(Protocol):
    """A replica's answer after its headers arrived; the body is still to be read.

    ``read()`` the whole body or ``chunks()`` as it arrives (``UpstreamStreamBroken`` if
    it breaks); ``abort()`` closes the connection unless the body was read to its end.
    """

    status: int

    @property
    def headers(self) -> list[tuple[str, str]]: ...

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers as sent, names in lower case."""
        ...

    @property
    def content_type(self) -> str: ...

    @property
    def is_event_stream(self) -> bool: ...

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]: ...

    def abort(self) -> None: ...


@dataclass(slots=True)
class AiohttpResponse:
    """An ``UpstreamResponse`` from aiohttp (https, streamed uploads, HEAD)."""

    status: int
    headers: list[tuple[str, str]]
    _resp: aiohttp.ClientResponse

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return [(k.lower(), v) for k, v in self._resp.raw_headers]

    @property
    def content_type(self) -> str:
        return self._resp.headers.get("content-type", "")

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def read(self) -> bytes:
        reused = False
        try:
            body = await self._resp.read()
            reused = self.status < 500  # a failing server's connection is not reused
            return body
        except _CLIENT_ERRORS as exc:
            raise UpstreamStreamBroken(f"replica reply broke: {exc!r}") from exc
        finally:  # also on cancellation (the client left): closing tells vLLM to abort
            if reused:
                self._resp.release()
            else:
                self._resp.close()

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as the replica sends them (no buffering, no re-framing)."""
        return body_chunks(self)

    async def next_chunk(self) -> bytes | None:
        """The next body bytes as they arrive; None at the body's end."""
        try:
            chunk = await self._resp.content.readany()
        except _CLIENT_ERRORS as exc:
            raise UpstreamStreamBroken(f"replica stream broke: {exc!r}") from exc
        if chunk:
            return chunk
        self._resp.release()  # read to the end: the connection goes back to the keep-alive pool
        return None

    def abort(self) -> None:
        """Drop the connection unless the body was read to the end.

        Closing the socket mid-reply is how vLLM learns the client left: it aborts the
        request and frees its KV blocks instead of generating for nobody.
        """
        if not self._resp.closed:
            self._resp.close()


class Upstream:
    """Pooled keep-alive HTTP client to all replicas."""

    def __init__(self, connect_timeout_s: float, first_byte_timeout_s: float, pool_size: int = 1024,
                 keepalive_s: float = 4.0):
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._first_byte_timeout_s = first_byte_timeout_s
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._wire: WirePool | None = None
        self._urls: dict[str, yarl.URL] = {}  # parsed once: aiohttp re-parses a str per request

    async def start(self) -> None:
        self._wire = WirePool(self._connect_timeout_s, self._first_byte_timeout_s,
                              self._keepalive_s, limit=self._pool_size)
        # Close idle connections before the replica does (see ``keepalive_s`` in the module
        # docstring): a request written to a connection the replica is closing fails.
        connector = aiohttp.TCPConnector(limit=self._pool_size, limit_per_host=0,
                                         keepalive_timeout=self._keepalive_s)
        self._session = aiohttp.ClientSession(
            connector=connector,
            # The client's own Cookie header is forwarded as is; the router keeps no jar
            # (a jar would hand one client's replica cookies to every other client).
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(
                total=None,
                sock_connect=self._connect_timeout_s,
                sock_read=self._first_byte_timeout_s,
            ),
        )

    async def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
            self._wire = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.start() was not awaited")
        return self._session

    async def send(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterable[bytes] | None,
    ) -> UpstreamResponse:
        """Send a request; return when the replica's headers arrived. ``headers``: raw,
        names in lower case (``request_headers``), as the replica will get them."""
        if self._wire is not None and WirePool.handles(method, url, body):
            assert body is None or isinstance(body, bytes)
            return await self._wire.send(method, url, headers, body)
        parsed = self._urls.get(url)
        if parsed is None:
            if len(self._urls) >= 4096:  # replicas x paths is small; bound it anyway
                self._urls.clear()
            parsed = self._urls[url] = yarl.URL(url)
        try:
            resp = await self.session.request(
                method, parsed, data=body,
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers])
        except _CLIENT_ERRORS as exc:
            raise UpstreamConnectError(f"replica {url} unreachable: {exc!r}") from exc
        return AiohttpResponse(status=resp.status, headers=list(resp.headers.items()), _resp=resp)

    async def get(
        self, url: str, timeout_s: float, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """A small GET for probes and scrapes: (status, body); raises UpstreamConnectError."""
        try:
            async with self.session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return resp.status, await resp.read()
        except _CLIENT_ERRORS as exc:
            raise UpstreamConnectError(f"GET {url} failed: {exc!r}") from exc
