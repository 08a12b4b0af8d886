"""Routes that change replica state go to every replica, with a per-replica result.

``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, ``/sleep``, ``/wake_up``,
``/reset_prefix_cache`` (POST) and ``/is_sleeping`` (GET) are sent to every replica in
the set (healthy or not: a state change should reach all) concurrently, each within
``timeout_s``. The answer:

    {"object": "list", "ok": BOOL, "data": [{"replica", "status", "content_type", "body"}]}

``replica`` is the replica's name as in ``x-lmroute-replica``; ``status`` its HTTP status
(0: unreachable or timed out, ``body`` then says why); ``body`` its reply, parsed when
JSON, else text. The HTTP status is 200 when every replica answered 2xx; when all
answered one same status, that status; otherwise 502. With an admin key the caller's
``Authorization`` (the router's key) is not forwarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from router.errors import UpstreamError
from router.replicas import Replica, ReplicaSet
from router.upstream import Upstream, request_headers

_AUTH = frozenset({b"authorization"})  # not forwarded where the router checked the key


def _reply_body(content_type: str, body: bytes) -> Any:
    if content_type.startswith("application/json"):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return body.decode("utf-8", "replace")


class FanOut:
    """Send one request to every replica; collect each answer."""

    def __init__(self, replicas: ReplicaSet, upstream: Upstream, *, timeout_s: float,
                 name_of: Callable[[str], str], drop_auth: bool) -> None:
        self._replicas = replicas
        self._upstream = upstream
        self._timeout_s = timeout_s
        self._name_of = name_of
        self._drop_auth = drop_auth

    async def _one(self, replica: Replica, method: str, path: str,
                   headers: list[tuple[bytes, bytes]], body: bytes | None) -> dict[str, Any]:
        out: dict[str, Any] = {"replica": self._name_of(replica.url)}
        try:
            async with asyncio.timeout(self._timeout_s):
                resp = await self._upstream.send(method, replica.url + path, headers, body)
                data = await resp.read()
        except (UpstreamError, TimeoutError) as exc:
            return {**out, "status": 0, "content_type": "", "body": str(exc) or "timed out"}
        return {**out, "status": resp.status, "content_type": resp.content_type,
                "body": _reply_body(resp.content_type, data)}

    async def send(self, request: Request) -> tuple[Response, list[dict[str, Any]]]:
        headers = request_headers(request.headers.raw,
                                  drop=_AUTH if self._drop_auth else frozenset())
        body = await request.body() if request.method != "GET" else None
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        results = await asyncio.gather(*(self._one(r, request.method, path, headers, body)
                                         for r in self._replicas.replicas))
        statuses = {r["status"] for r in results}
        ok = bool(results) and all(200 <= s < 300 for s in statuses)
        status = 200 if ok else statuses.pop() if len(statuses) == 1 and 0 not in statuses \
            else 502
        payload = {"object": "list", "ok": ok, "data": results}
        return Response(orjson.dumps(payload), status_code=status,
                        media_type="application/json"), results
