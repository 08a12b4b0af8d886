"""Pinning one request to one replica: the ``X-LMRoute-Pin-Replica`` header, admin only.

``lmroute validate --target ROUTER`` compares one prompt served cold, warm on the same
replica, and from the pool on another; through a router it must choose the replica of
each request. The header names a replica as the router's ``x-lmroute-replica`` does
(``r0``, ``r1``, ... in ``--backend`` order; its URL with ``--expose-replica-header``;
a URL is accepted either way).

Who may pin. Only a request carrying the admin key (``Authorization: Bearer KEY``, the
``admin_key`` setting): any other caller that sends the header gets 403 ``pin_forbidden``,
and with no admin key configured pinning is off (403 too). A refusal, not a silent
ignore: a validation run that believed it chose the replica must not quietly compare two
replies of one replica. A name no replica has is 400 ``unknown_replica``.

What a pin does. The request goes to that replica only (``ParsedRequest.replica``, the
model map's pin: healthy or not, draining or not, no failover to another replica: a
validation reply from elsewhere would be a false pass). A pinned request is the
operator's, not a tenant's: it is admitted under no tenant's limits and gets no tenant
salt; neither the header nor the admin key is forwarded to the replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from starlette.requests import Request

from router.bodies import read_body
from router.errors import BadRequest
from router.headers import header
from router.openai_api import Endpoint, ParsedRequest, parse_request
from router.proxy import PATHS, Prepare, Proxy, Target

PIN_HEADER = "x-lmroute-pin-replica"


def pin_url(name: str, names: Mapping[bytes, bytes] | None, urls: list[str]) -> str:
    """The URL of the replica ``name`` names (``rN`` or a URL); 400 when none does."""
    wanted = name.strip().rstrip("/")
    if wanted in urls:
        return wanted
    for url, shown in (names or {}).items():
        if shown.decode() == wanted:
            return url.decode("latin-1")
    raise BadRequest(f"no replica {name!r} to pin (known: r0..r{len(urls) - 1} or a URL)",
                     param=PIN_HEADER, code="unknown_replica")


def pinned_prepare(proxy: Proxy, endpoint: Endpoint, url: str) -> Prepare:
    """The proxy's parse step for a chat/completions request pinned to ``url``."""

    async def prepare(request: Request) -> tuple[ParsedRequest, Target]:
        raw = await read_body(request, proxy.max_body_bytes)
        parsed = parse_request(endpoint, raw, header(request, b"x-session-id"))
        return replace(parsed, replica=url), Target("POST", PATHS[endpoint], raw)

    return prepare
