"""The replica hop's keep-alive connections (``router.wire.Conn``), and requests over them.

Scope (``WirePool.handles``): plain ``http://`` URLs, a body in memory (or none), any
method but HEAD (a HEAD reply's ``content-length`` announces a body that never comes,
which the parser cannot know). ``router.upstream`` sends everything else (https, streamed
uploads, HEAD) through aiohttp.

- **Reuse**: ``acquire`` takes the replica's most recently used idle connection (LIFO: the
  warmest; the others age out).
- **Limit**: at most ``limit`` connections open in all, idle ones included. At the limit
  an idle connection to another replica is closed to make room; with none idle, a request
  waits for a connection to be released or closed.
- **Idle close**: the router closes an idle connection after ``keepalive_s``, below the
  replica's own idle timeout, so the replica never closes one under a request being
  written (``router.upstream``'s docstring). One sweep timer runs while any connection is
  idle, set for when the oldest idle connection turns ``keepalive_s`` old, so none lives
  idle much longer (a timer's lateness: milliseconds); ``acquire`` also skips any idle
  for ``keepalive_s`` or more, so none is ever used past it.
- **Requests** are written in one ``write``: the request line and ``host`` (built once per
  method and URL), the caller's headers, ``content-length``, the body.
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import urlsplit

from router.errors import UpstreamConnectError
from router.wire import Conn, Key, WireResponse


class WirePool:
    """Keep-alive connections to every replica, and requests over them."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float, keepalive_s: float,
                 limit: int = 1024):
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self.limit = limit
        self.idle: dict[Key, list[Conn]] = {}
        self.open: set[Conn] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweeping = False
        self._targets: dict[str, tuple[Key, bytes]] = {}  # url -> (replica, request line head)
        self.loop = asyncio.get_running_loop()  # made in the router's lifespan

    @staticmethod
    def handles(method: str, url: str, body: object) -> bool:
        return (url.startswith("http://") and method != "HEAD"
                and (body is None or isinstance(body, bytes)))

    async def send(self, method: str, url: str, headers: list[tuple[bytes, bytes]],
                   body: bytes | None) -> WireResponse:
        """Send a request (``headers`` raw, as ``Upstream.send``'s); return once the reply's
        headers arrived."""
        key, line = self._target(method, url)
        payload = body or b""
        head = [line]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        if payload or method in ("POST", "PUT", "PATCH"):
            head.append(b"content-length: %d\r\n" % len(payload))
        head.append(b"\r\n")
        head.append(payload)
        conn = await self._acquire(key)
        resp = conn.start(b"".join(head), self.read_timeout_s)
        try:
            assert conn.head is not None
            await conn.head
        except BaseException:
            conn.close()
            raise
        return resp

    def _target(self, method: str, url: str) -> tuple[Key, bytes]:
        cached = self._targets.get(method + url)
        if cached is not None:
            return cached
        parts = urlsplit(url)
        if parts.hostname is None:
            raise UpstreamConnectError(f"replica URL {url!r} has no host")
        key = (parts.hostname, parts.port or 80)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        host = parts.netloc.rsplit("@", 1)[-1]
        line = f"{method} {path} HTTP/1.1\r\nhost: {host}\r\n".encode("latin-1")
        if len(self._targets) >= 4096:  # replicas x paths x methods is small; bound it anyway
            self._targets.clear()
        self._targets[method + url] = (key, line)
        return key, line

    async def _acquire(self, key: Key) -> Conn:
        idle = self.idle.get(key)
        now = self.loop.time()
        while idle:
            conn = idle.pop()
            # ``closing``: closed under us, its ``connection_lost`` not yet run (uvloop)
            if not conn.closed and not conn.closing() and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        while len(self.open) >= self.limit:
            if not self._evict_idle():
                waiter = self.loop.create_future()
                self._waiters.append(waiter)
                await waiter
                return await self._acquire(key)
        conn = Conn(self, key)
        self.open.add(conn)
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: conn, key[0], key[1]), self.connect_timeout_s)
        except (TimeoutError, OSError) as exc:
            self.forget(conn)
            raise UpstreamConnectError(f"replica {key[0]}:{key[1]} unreachable: {exc!r}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def release(self, conn: Conn) -> None:
        """A reply ended and the connection may carry another request."""
        conn.idle_since = self.loop.time()
        self.idle.setdefault(conn.key, []).append(conn)
        self._wake_one()
        if not self._sweeping:  # else the timer is set for an older connection's expiry
            self._sweeping = True
            self.loop.call_later(self.keepalive_s, self._sweep)

    def forget(self, conn: Conn) -> None:
        """A connection closed: it no longer counts toward ``limit``."""
        if conn in self.open:
            self.open.discard(conn)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _evict_idle(self) -> bool:
        """Close the oldest idle connection of some replica (at the limit); False if none."""
        for idle in self.idle.values():
            if idle:
                idle.pop(0).close()
                return True
        return False

    def _sweep(self) -> None:
        """Close connections idle for ``keepalive_s``; run again while any are idle."""
        cutoff = self.loop.time() - self.keepalive_s
        oldest = None
        for key, idle in list(self.idle.items()):
            keep = []
            for conn in idle:
                if not conn.closed and conn.idle_since > cutoff:
                    keep.append(conn)
                    if oldest is None or conn.idle_since < oldest:
                        oldest = conn.idle_since
                else:
                    conn.close()
            if keep:
                self.idle[key] = keep
            else:
                del self.idle[key]
        if oldest is not None:
            self.loop.call_at(oldest + self.keepalive_s, self._sweep)
        else:
            self._sweeping = False

    def close(self) -> None:
        for conn in list(self.open):
            conn.close()
        self.idle.clear()
