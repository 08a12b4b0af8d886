"""The floor of a Python router: a uvloop byte relay with no HTTP, no routing, no ASGI.

Every client connection gets one connection to a backend (round robin over
``--backend``), and bytes are copied both ways as they arrive: per upstream read, one
``data_received`` and one ``transport.write``, nothing else. It is not a router (a client
connection stays on one backend, nothing is parsed); ``bench/peers.py --floor`` runs it
beside the routers to show what the interpreter and uvloop alone cost per request and per
streamed event, i.e. how close any Python design on this stack could come to the Rust
routers.

``--workers N`` binds the port once and forks N processes that serve that one socket, as
``lmroute serve --workers N`` does (``router.workers``): what N processes cost per event
when nothing but the relay runs in them (``bench/peers.py --floor-workers``).

    python bench/raw_relay.py --port 8100 --backend http://127.0.0.1:8001 [--backend ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import socket
from urllib.parse import urlsplit

import uvloop

from router.workers import bind


class _Pipe(asyncio.Protocol):
    """One side of a relayed connection: what it reads goes to the ``other`` side's
    transport (held until that side is connected)."""

    def __init__(self, other: _Pipe | None = None):
        self.other = other
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # bytes read before the other side connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        other = self.other
        if other is None or other.transport is None:
            self.early.append(data)
        else:
            other.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()


async def serve(sock: socket.socket, backends: list[str]) -> None:
    """Relay every connection accepted on ``sock`` to the next of ``backends``."""
    loop = asyncio.get_running_loop()
    targets = itertools.cycle([(u.hostname, u.port) for u in map(urlsplit, backends)])
    connecting: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak refs)

    def accept() -> _Pipe:
        client = _Pipe()
        host, port = next(targets)

        async def connect() -> None:
            backend = _Pipe(client)
            try:
                await loop.create_connection(lambda: backend, host, port)
            except OSError:
                if client.transport is not None:
                    client.transport.close()
                return
            assert backend.transport is not None
            if client.transport is None or client.transport.is_closing():
                backend.transport.close()  # the client left while we connected
                return
            client.other = backend
            for data in client.early:
                backend.transport.write(data)
            client.early.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return client

    server = await loop.create_server(accept, sock=sock)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--backend", action="append", required=True)
    ap.add_argument("--workers", type=int, default=1,
                    help="processes serving the one socket (forked after binding it)")
    args = ap.parse_args()
    sock = bind(args.host, args.port)  # the socket ``lmroute serve`` listens on
    if args.workers <= 1:
        uvloop.run(serve(sock, args.backend))
        return
    children = []
    for _ in range(args.workers):  # forked before any event loop exists
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            uvloop.run(serve(sock, args.backend))
            os._exit(0)
        children.append(pid)
    sock.close()

    def stop(signum: int, _frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):  # one that has already gone
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for child in children:
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()
