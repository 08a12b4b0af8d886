"""One HTTP/1.1 connection to a replica and the reply on it, parsed by httptools.

Why not aiohttp on the replica hop: on a streamed reply aiohttp spent more Python per
upstream read than the rest of the router (its protocol, ``StreamReader``, a timeout
rescheduled on every read, request building); docs/benchmarks.md has the profiles. Here a
read costs one ``httptools`` parse (C) and one hand-over of its body bytes as one piece
(the parser gives one piece per HTTP chunk, i.e. per SSE event; a read holding a burst of
events goes to the client as one send, and no event waits for a later read).
``router.wire_pool`` keeps these connections and writes the requests.

- ``Conn`` (an ``asyncio.Protocol``) carries one request at a time. When a reply ends
  (its bytes are then all in its ``WireResponse``) the connection goes back to the pool at
  once, unless either side said ``connection: close``.
- **Read timeout** (``read_timeout_s``): bounds the time to the reply's headers and between
  any two reads of its body (aiohttp's ``sock_read``). Lazily: a read stores the time;
  one timer per request fires at the earliest possible deadline and re-arms itself if a
  read came since, so a read costs no timer operation.
- **Flow control**: a reply whose unread bytes exceed ``HIGH_WATER`` pauses the socket's
  reading until the consumer has taken half: a slow client slows the replica's socket,
  not the router's memory.
- **Errors**: before the headers (reset, closed, timeout, malformed, or a write to a
  socket the replica closed before ``connection_lost`` told us):
  ``UpstreamConnectError`` from the head future; after (the body broke):
  ``UpstreamStreamBroken`` from ``chunks()``. A body delimited by the connection's close
  (no content-length, not chunked) ends normally at the close. Closing the connection
  mid-reply (``abort``, or the consumer's cancellation) is how vLLM learns the client left.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, cast

import httptools

from router.body_chunks import body_chunks
from router.errors import UpstreamConnectError, UpstreamStreamBroken

if TYPE_CHECKING:
    from router.forward import Forward
    from router.wire_pool import WirePool

HIGH_WATER = 1 << 20  # unread reply bytes that pause the replica's socket
Key = tuple[str, int]


class WireResponse:
    """A replica's reply on a ``Conn``: status and headers, then its body as it arrives."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_done",
        "_error",
        "_length",
        "_sink",
        "_unread",
        "_waiter",
        "_whole",
        "raw_headers",
        "status",
    )

    def __init__(self, conn: Conn):
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []  # names in lower case
        self._conn: Conn | None = conn
        self._chunks: deque[bytes] = deque()
        self._unread = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._error: str | None = None
        self._length = False  # the reply declared its length (content-length or chunked)
        self._whole = False  # read() wants the whole body: no pause for flow control
        self._sink: Forward | None = None  # router.forward: reads go straight to the client

    # -- the consumer's side -------------------------------------------------------
    @property
    def headers(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers]

    @property
    def content_type(self) -> str:
        for key, value in self.raw_headers:
            if key == b"content-type":
                return value.decode("latin-1")
        return ""

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def read(self) -> bytes:
        """The whole body (the connection is closed if reading it is cancelled)."""
        self._whole = True
        self.resume_reading()
        try:
            while not self._done:
                if self._error is not None:
                    raise UpstreamStreamBroken(f"replica reply broke: {self._error}")
                await self._next()
        finally:
            if not self._done:
                self.abort()
        body = b"".join(self._chunks)
        self._chunks.clear()
        return body

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as the replica sends them (no buffering, no re-framing)."""
        return body_chunks(self)

    async def next_chunk(self) -> bytes | None:
        """The next body bytes as they arrive; None at the body's end."""
        while True:
            chunk = self.take()
            if chunk is not None:
                return chunk
            if self._done:
                return None
            if self._error is not None:
                raise UpstreamStreamBroken(f"replica stream broke: {self._error}")
            await self._next()

    async def _next(self) -> None:
        """Wait for the connection's next hand-over (bytes, the end, or an error)."""
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    def abort(self) -> None:
        """Close the connection unless the reply was read to its end."""
        conn, self._conn = self._conn, None
        if conn is not None and not self._done:
            conn.close()

    # -- router.forward's hand-over ------------------------------------------------
    def take(self) -> bytes | None:
        """The next buffered chunk, or None."""
        if not self._chunks:
            return None
        chunk = self._chunks.popleft()
        self._took(len(chunk))
        return chunk

    def attach(self, sink: Forward) -> tuple[str | None] | None:
        """Send later reads to ``sink`` (none may be buffered); if the reply already
        ended, attach nothing and return ``(error or None,)``."""
        assert not self._chunks
        if self._done or self._error is not None:
            return (None if self._done else self._error,)
        self._sink = sink
        return None

    def detach(self) -> None:
        self._sink = None

    def pause_reading(self) -> None:
        if self._conn is not None:
            self._conn.pause()

    def resume_reading(self) -> None:
        if self._conn is not None:
            self._conn.resume()

    def _took(self, n: int) -> None:
        self._unread -= n
        conn = self._conn
        if conn is not None and conn.paused and self._unread < HIGH_WATER // 2:
            conn.resume()

    # -- the connection's side -----------------------------------------------------
    def _feed(self, chunk: bytes) -> None:
        """Buffer a chunk for the consumer (``Conn._flush`` hands it to a sink itself)."""
        self._chunks.append(chunk)
        self._unread += len(chunk)
        self._wake()
        if self._unread > HIGH_WATER and not self._whole and self._conn is not None:
            self._conn.pause()

    def _end(self, error: str | None) -> None:
        if error is None:
            self._done = True
        else:
            self._error = error
        if self._sink is not None:
            self._sink.end(error)
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Conn(asyncio.Protocol):
    """One keep-alive connection to a replica; httptools calls the ``on_*`` methods."""

    def __init__(self, pool: WirePool, key: Key):
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        # Body pieces parsed from the current read: a chunked reply gives one per HTTP
        # chunk (one per SSE event), and a read that holds several goes on as one piece.
        self._body: list[bytes] = []
        # httptools calls ``on_body`` per piece (looked up when the parser is made, below):
        # the list's own append is a C call, not a Python frame, on every event (the list
        # is emptied in place, never replaced).
        self.on_body = self._body.append
        self.parser = httptools.HttpResponseParser(self)
        self.resp: WireResponse | None = None
        self.head: asyncio.Future[None] | None = None  # done when the reply's headers are in
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        self.last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.resp is None:  # bytes on an idle connection: nothing may follow them
            self.close()
            return
        self.last_read = self.pool.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"malformed reply: {exc}")
        else:
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        resp = self.resp
        if resp is not None and resp.status and not resp._length and exc is None:
            self._done_reply(keep=False)  # a body delimited by the close ended normally
        else:
            self._fail(f"connection lost ({exc!r})" if exc else "replica closed the connection")

    # -- httptools callbacks -------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.resp is not None
        name = name.lower()
        if name in (b"content-length", b"transfer-encoding"):
            self.resp._length = True
        self.resp.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.resp is not None and self.head is not None
        status = self.parser.get_status_code()
        if status < 200:  # an interim reply (100 Continue, 103 Early Hints): the real one follows
            self.resp.raw_headers.clear()
            self.resp._length = False
            return
        self.resp.status = status
        if not self.head.done():
            self.head.set_result(None)

    def _flush(self) -> None:
        """Hand this read's body bytes to the reply, as one piece."""
        parts, resp = self._body, self.resp
        if parts and resp is not None:
            chunk = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            sink = resp._sink
            if sink is not None:  # one hop less on every event of a forwarded stream
                sink.chunk(chunk)
            else:
                resp._feed(chunk)

    def on_message_complete(self) -> None:
        if self.resp is not None and not self.resp.status:
            return  # the end of an interim reply
        self._done_reply(keep=self.parser.should_keep_alive())

    # -- requests ------------------------------------------------------------------
    def start(self, request: bytes, read_timeout_s: float) -> WireResponse:
        """Write one request; its reply arrives on the returned response."""
        assert self.transport is not None
        resp = self.resp = WireResponse(self)
        self.head = self.pool.loop.create_future()
        self.last_read = self.pool.loop.time()
        self._arm(read_timeout_s, read_timeout_s)
        try:
            self.transport.write(request)
        except RuntimeError as exc:
            # uvloop closes the handle of a socket the replica reset (a killed replica) at
            # once and calls ``connection_lost`` on a later turn of the loop: a write in
            # between raises. Nothing was sent, so it is a connect error (retried elsewhere).
            self._fail(f"replica closed the connection ({exc})")
        return resp

    def _arm(self, delay: float, timeout_s: float) -> None:
        self._timer = self.pool.loop.call_later(delay, self._check, timeout_s)

    def _check(self, timeout_s: float) -> None:
        if self.resp is None:
            return
        quiet = self.pool.loop.time() - self.last_read
        if quiet >= timeout_s:
            self._fail(f"no bytes from the replica for {timeout_s:g} s")
        else:
            self._arm(timeout_s - quiet, timeout_s)

    def _take_reply(self) -> WireResponse | None:
        """End the current request's part of this connection: hand over what this read
        brought, stop its timer, and return its reply."""
        self._flush()  # what arrived intact goes first
        resp, self.resp = self.resp, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return resp

    def _done_reply(self, *, keep: bool) -> None:
        resp = self._take_reply()
        if resp is not None:
            resp._conn = None
            resp._end(None)
        if keep and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    def _fail(self, error: str) -> None:
        resp = self._take_reply()
        head = self.head
        if head is not None and not head.done():
            head.set_exception(UpstreamConnectError(error))
        elif resp is not None:
            resp._end(error)
        self.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def closing(self) -> bool:
        """Whether the transport is closed or closing, ``connection_lost`` still to come."""
        return self.transport is not None and self.transport.is_closing()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()
        if self.resp is not None:
            self._fail("connection closed by the router")

