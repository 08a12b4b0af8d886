"""A buffered response's head written together with its body: one socket write where
uvicorn makes two.

uvicorn writes a response's status line and headers the moment the app sends
``http.response.start``, and the body at the next send. For a reply whose body is all
in hand (every non-streamed reply, every error) that is two system calls and two TCP
segments where one would do. On loopback a write also runs the receiver's TCP input in
the writer's system call, so it is the dearest thing a short request does in the
kernel: ``bench/profile_router.py --syscalls`` counted 3 writes a non-streamed request
for lmroute against 2 for sglang-router, which writes head and body together.

``HeldHead`` stands in for the client connection's transport in one request's uvicorn
cycle (``router.framing`` installs it when the request's head is parsed) until the
response's head is out, then puts the real transport back, so the body's later writes
(a stream's events, ``router.forward``'s direct ones) go straight to the socket:

- a first write that declares a ``content-length`` (a head whose body follows: Starlette's
  ``Response`` sends both in one step, and so does uvicorn's own 500) is held, and the
  next write goes out joined to it. No timer: an app that awaits something between a
  sized head and its body delays the head to the body (the client can read neither
  before), and a response that ends without a body (an exception after the head) closes
  the transport, which writes what is held first;
- any other first write goes out at once, as before: a stream's chunked head (its first
  event may be seconds away), a ``100 Continue``, and any head of a HEAD request (uvicorn
  writes no body for one).

``is_closing`` passes through. ``write``, ``close`` and ``is_closing`` are all a uvicorn
cycle calls on its transport.
"""

from __future__ import annotations

import asyncio
from typing import Any

# uvicorn writes header names lower-cased, each line after the CRLF of the one before.
_LENGTH = b"\r\ncontent-length: "


class HeldHead:
    __slots__ = ("_cycle", "_held", "_transport")

    def __init__(self, cycle: Any, transport: asyncio.Transport):
        self._cycle = cycle  # uvicorn's RequestResponseCycle, whose transport this is
        self._transport = transport
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._done()
            self._transport.write(held + data)
        elif _LENGTH in data and self._cycle.scope["method"] != "HEAD":
            self._held = data
        else:
            self._done()
            self._transport.write(data)

    def close(self) -> None:
        held = self._held
        self._done()
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def _done(self) -> None:
        """The head is out (or going now): the cycle writes to the socket from here on."""
        self._held = None
        if self._cycle.transport is self:
            self._cycle.transport = self._transport
