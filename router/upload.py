"""Streamed uploads (audio transcriptions and translations): through, and replayable.

A multipart upload is not read whole before it is forwarded: ``ReplayBody`` reads the
client's body as the replica consumes it, keeping what it read, so an attempt that fails
before the replica's first byte is replayed to the next replica from the kept bytes, then
from the client again. Size: a declared ``Content-Length`` over ``max_body_bytes`` is a
413 before anything is sent (``check_declared``); a body without one that grows past the
limit, or whose client leaves mid-upload, is cut there (``cut`` says why): the replica
gets a truncated body and answers its own error, and no error is raised inside the HTTP
client, where it would read as the replica's fault.

Routing needs one thing from the upload, its ``model`` field: ``sniff_model`` reads
ahead (into the same kept bytes) until that field's value is complete, the first file
part starts, or ``SNIFF_BYTES`` were read: SDKs send form fields before files, and an
upload that names its model late is routed as one naming none.

``guarded(request, body)``: the same request whose ``receive`` waits until the upload
was read to its end before it passes on later messages (a client disconnect): one
reader of the connection at a time.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.types import Message

from router.errors import BadRequest, PayloadTooLarge

SNIFF_BYTES = 64 * 1024
_MODEL = re.compile(rb'name="model"\r\n(?:[^\r\n]+\r\n)*\r\n([^\r]*)\r\n')
_FILE = re.compile(rb'; filename="')


class ReplayBody:
    """The client's body, read once, replayable from the start for each attempt."""

    def __init__(self, request: Request, limit: int) -> None:
        self._receive = request.receive
        self._limit = limit
        self._kept: list[bytes] = []
        self._size = 0
        self.complete = asyncio.Event()
        self.cut = ""  # why the body was cut short ("" while whole)

    async def _next(self) -> None:
        """Keep the client's next chunk; at the end (or a cut) set ``complete``."""
        if self.complete.is_set():
            return
        message = await self._receive()
        if message["type"] != "http.request":
            self.cut = "the client disconnected during the upload"
            self.complete.set()
            return
        chunk: bytes = message.get("body", b"")
        self._size += len(chunk)
        if self._size > self._limit:
            self.cut = f"request body exceeds the {self._limit}-byte limit"
            self.complete.set()
            return
        if not message.get("more_body", False):
            self.complete.set()
        if chunk:
            self._kept.append(chunk)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The whole body from its first byte: the kept part, then the rest as it comes."""
        i = 0
        while True:
            while i < len(self._kept):
                yield self._kept[i]
                i += 1
            if self.complete.is_set():
                return
            await self._next()

    async def sniff_model(self) -> str | None:
        """The ``model`` form field, if it comes before any file (see module doc)."""
        while True:
            head = b"".join(self._kept)
            found = _MODEL.search(head)
            if found:
                return found.group(1).decode("utf-8", "replace")
            file_at = _FILE.search(head)
            if file_at or self.complete.is_set() or len(head) >= SNIFF_BYTES:
                return None
            await self._next()


def check_declared(request: Request, limit: int) -> None:
    """413 for a declared ``Content-Length`` over ``limit`` (400 if not a number)."""
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise BadRequest("invalid Content-Length header")
    if declared is not None and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")


def guarded(request: Request, body: ReplayBody) -> Request:
    """``request`` whose later ``receive`` calls wait for the upload to be read."""

    async def receive() -> Message:
        await body.complete.wait()
        return await request.receive()

    return Request(request.scope, receive)
