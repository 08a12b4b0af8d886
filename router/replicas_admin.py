"""The admin API for replica membership (``router.membership``), behind the admin key.

    GET    /admin/replicas          every replica: URL, name, origins, healthy, draining,
                                    in flight, models
    POST   /admin/replicas          {"url": URL} -> joins (origin "admin"); 200 with the list
    DELETE /admin/replicas          {"url": URL} -> leaves now, whatever origin wanted it;
                                    404 if unknown
    POST   /admin/replicas/drain    {"url": URL, "drain": true|false} (default true)

Bodies come through the gate and ``load_json``; errors are raised (OpenAI-shaped).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from router.errors import BadRequest, NotFound
from router.jsonbody import load_json
from router.membership import Membership, replica_url


def _listing(m: Membership) -> Response:
    out = [{"url": r.url, "name": m.gate.name_of(r.url),
            "origins": sorted(m.origins.get(r.url, ())), "healthy": r.healthy,
            "draining": r.draining, "in_flight": r.in_flight, "models": m.models.of(r.id)}
           for r in m.replicas.replicas]
    return Response(orjson.dumps({"replicas": out}), media_type="application/json")


async def _url(request: Request) -> tuple[str, dict[str, Any]]:
    body = load_json(await request.body())
    url = body.get("url") if isinstance(body, dict) else None
    checked = replica_url(url) if isinstance(url, str) else None
    if checked is None:
        raise BadRequest('expected {"url": "http://HOST:PORT"} (ASCII host, optional path)',
                         param="url")
    return checked, body


def replica_admin_routes(m: Membership) -> list[Route]:
    """Unguarded: the caller puts them behind the gate's admin access."""

    async def listing(request: Request) -> Response:
        return _listing(m)

    async def add(request: Request) -> Response:
        url, _ = await _url(request)
        await m.admit(url)
        return _listing(m)

    async def remove(request: Request) -> Response:
        url, _ = await _url(request)
        if not await m.evict(url):
            raise NotFound(f"no replica {url}", param="url")
        return _listing(m)

    async def drain(request: Request) -> Response:
        url, body = await _url(request)
        on = body.get("drain", True)
        if not isinstance(on, bool):
            raise BadRequest("'drain' must be a boolean", param="drain")
        if not m.drain(url, on):
            raise NotFound(f"no replica {url}", param="url")
        return _listing(m)

    return [Route("/admin/replicas", listing, methods=["GET"]),
            Route("/admin/replicas", add, methods=["POST"]),
            Route("/admin/replicas", remove, methods=["DELETE"]),
            Route("/admin/replicas/drain", drain, methods=["POST"])]
