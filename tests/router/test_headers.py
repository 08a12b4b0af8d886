"""router.headers reads a request header as Starlette's ``request.headers`` does."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from router.headers import has_header, header

RAW = [
    (b"host", b"127.0.0.1"),
    (b"authorization", b"Bearer k1"),
    (b"x-session-id", b"caf\xe9"),  # latin-1, as HTTP/1.1 carries it
    (b"authorization", b"Bearer k2"),  # a repeat: the first one counts
    (b"X-Request-Id", b"upper"),  # not lower-cased by the server: neither reads it
    (b"content-length", b""),
]


def _request(headers: object) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


@pytest.mark.parametrize("name", ["authorization", "x-session-id", "x-request-id",
                                  "content-length", "content-encoding", "host"])
@pytest.mark.parametrize("shape", ["list", "tuple", "lists"])
def test_a_header_reads_as_starlette_reads_it(name: str, shape: str) -> None:
    raw = {"list": RAW, "tuple": tuple(RAW), "lists": [list(item) for item in RAW]}[shape]
    ours = _request(raw)
    starlette = _request(list(RAW)).headers
    assert header(ours, name.encode()) == starlette.get(name)
    assert header(ours, name.encode(), "none") == starlette.get(name, "none")
    assert has_header(ours, name.encode()) == (name in starlette)


def test_the_values_it_returns() -> None:
    request = _request(RAW)
    assert header(request, b"authorization") == "Bearer k1"
    assert header(request, b"x-session-id") == "caf\xe9"
    assert header(request, b"x-request-id") is None
    assert header(request, b"content-length") == ""
    assert not has_header(request, b"x-lmroute-pin-replica")
