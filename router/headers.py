"""One request header read straight from the ASGI scope.

``header(request, name)`` scans the scope's raw header list for ``name`` (bytes, lower
case) and returns the first value, decoded as latin-1, or ``default``: what Starlette's
``request.headers.get`` returns (it compares the lowered name with the raw names as the
server gave them, which ASGI servers give in lower case), without building the
``Headers`` mapping and its Python calls on every request; compiled by ``make fast``, the
scan is a C loop. The hot path reads 6-8 headers a request this way.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection


def header(request: HTTPConnection, name: bytes, default: str | None = None) -> str | None:
    """The first value of header ``name`` (lower case), or ``default``."""
    # Any, not a tuple type: ASGI allows any two-item iterables, and a compiled build
    # would check a declared type on every item.
    raw: Any = request.scope["headers"]
    for key, value in raw:
        if key == name:
            decoded: str = value.decode("latin-1")
            return decoded
    return default


def has_header(request: HTTPConnection, name: bytes) -> bool:
    """Whether the request carries header ``name`` (lower case)."""
    return header(request, name) is not None
