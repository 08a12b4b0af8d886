"""Request bodies, read safely: one size limit counting decoded bytes.

``read_decoded(request, limit)``: the raw body is read under ``limit`` (413 as soon as it
is exceeded, ``read_body``), then each ``Content-Encoding`` (``gzip``,
``deflate`` (zlib, or raw deflate as some clients send), ``identity``; others 415) is
undone, last applied first, by an incremental ``zlib`` decompressor told to produce at most
``limit + 1`` bytes: a zip bomb stops at the limit with 413 and never inflates further.
"""

from __future__ import annotations

import zlib

from starlette.requests import Request

from router.errors import BadRequest, PayloadTooLarge, UnsupportedEncoding
from router.headers import header


async def read_body(request: Request, limit: int) -> bytes:
    """Read the whole body, refusing (413) as soon as it is known to exceed ``limit``; a
    body ``router.gate`` read already (and held to its limit) is taken as it is."""
    read: bytes | None = getattr(request, "_body", None)
    if read is not None and len(read) <= limit:
        return read
    declared = header(request, b"content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest("invalid Content-Length header")
        if int(declared) > limit:
            raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        parts.append(chunk)
    body = b"".join(parts)
    request._body = body  # Starlette's cache: body() and stream() return it from now on
    return body


_ZLIB = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def encodings(header: str | None) -> list[str]:
    """The ``Content-Encoding`` codings in the order applied; 415 for one we cannot undo."""
    out = [c.strip().lower() for c in (header or "").split(",") if c.strip()]
    for coding in out:
        if coding != "identity" and coding not in _ZLIB:
            raise UnsupportedEncoding(f"Content-Encoding {coding!r} is not supported "
                                      "(gzip, deflate, identity)")
    return [c for c in out if c != "identity"]


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    decoder = zlib.decompressobj(wbits)
    parts: list[bytes] = []
    size = 0
    pending = data
    while pending:
        chunk = decoder.decompress(pending, limit + 1 - size)
        size += len(chunk)
        parts.append(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit once decompressed")
        pending = decoder.unconsumed_tail
        if decoder.eof and decoder.unused_data and wbits > zlib.MAX_WBITS:
            # Concatenated gzip members: decode the next one.
            decoder, pending = zlib.decompressobj(wbits), decoder.unused_data
        if not pending and not decoder.eof:
            raise BadRequest("truncated compressed request body", code="invalid_encoding")
    return b"".join(parts)


def decode(data: bytes, codings: list[str], limit: int) -> bytes:
    """Undo ``codings`` (as applied, first to last); 400 on corrupt data, 413 past ``limit``."""
    for coding in reversed(codings):
        wbits = _ZLIB[coding]
        try:
            data = _inflate(data, wbits, limit)
        except zlib.error as exc:
            if coding != "deflate":
                raise BadRequest(f"corrupt {coding} request body: {exc}",
                                 code="invalid_encoding") from None
            try:  # raw deflate without the zlib wrapper
                data = _inflate(data, -zlib.MAX_WBITS, limit)
            except zlib.error:
                raise BadRequest(f"corrupt deflate request body: {exc}",
                                 code="invalid_encoding") from None
    return data


async def read_decoded(request: Request, limit: int) -> bytes:
    """The body with its content codings undone, at most ``limit`` bytes either way."""
    codings = encodings(header(request, b"content-encoding"))
    raw = await read_body(request, limit)
    return decode(raw, codings, limit) if codings else raw
