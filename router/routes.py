"""The router's HTTP surface: its routes, and the one place errors become responses.

    POST /v1/chat/completions, /v1/completions   the proxy (``router.proxy``)
    GET  /v1/models                              union of the healthy replicas' models
    GET  /health, /ready                         liveness; readiness (503 with no replica,
                                                 or draining after SIGTERM: router.drain)
    GET  /metrics                                Prometheus text (``router.metrics``)
    GET  /replicas                               replica state and KV-event index status
    POST /index/lookup                           where the index (+ in-flight) puts a prefix
    GET  /policy                                 the active policy's ``describe()``
    GET|POST /admin/...                          ``router.admin``
    GET  /openapi.json                           what the router accepts (``router.openapi``)

Every route is wrapped by the ``Gate`` (``router.gate``): keys, internal routes behind
the admin key, one body size limit, decoded request bodies, tenant limits.

The chat/completions routes are plain Starlette routes taking the raw request: FastAPI's
body validation stays off the hot path (``openai_api`` parses bytes). Handlers raise
``LmrouteError``; ``install_error_handlers`` renders it (and Starlette's HTTP errors and
any unexpected exception) as the OpenAI error shape, in ``_error_response`` only (a 429
carries ``Retry-After``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from router import compiled
from router.admin import PolicyAdmin, admin_routes
from router.canary import Canary, canary_routes
from router.drain import Drain
from router.errors import BadRequest, LmrouteError, NotFound, RateLimited
from router.events import EngineEvents
from router.gate import Gate
from router.headers import header
from router.locator import Locator
from router.metrics import RouterMetrics
from router.openai_api import Endpoint, parse_request
from router.openapi import openapi_document
from router.pin import pin_url, pinned_prepare
from router.proxy import Proxy
from router.replicas import ReplicaSet

log = logging.getLogger("lmroute.routes")


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


@dataclass(frozen=True, slots=True)
class Routes:
    """The endpoints over the app's parts (built once by ``create_app``)."""

    proxy: Proxy
    replicas: ReplicaSet
    metrics: RouterMetrics
    locator: Locator
    events: EngineEvents
    admin: PolicyAdmin
    gate: Gate
    mode: str  # "token" or "text": how prompts are hashed
    drain: Drain  # draining after SIGTERM: not ready, whatever the replicas
    canary: Canary | None = None  # the live canary (router.canary), offered routed replies

    async def chat(self, request: Request) -> Response:
        return await self._proxied("chat", request)

    async def completions(self, request: Request) -> Response:
        return await self._proxied("completions", request)

    async def _proxied(self, endpoint: Endpoint, request: Request) -> Response:
        """A routed request; pinned to one replica when the gate allowed it (``router.pin``)."""
        pin = request.scope.get("state", {}).get("pin")
        if pin is None:
            if self.canary is None or not self.canary.every:
                return await self.proxy.handle(endpoint, request)
            raw = await request.body()  # already in memory (the gate read it); kept for a replay
            response = await self.proxy.handle(endpoint, request)
            if response.status_code == 200:
                self.canary.offer(endpoint, raw, header(request, b"authorization"))
            return response
        url = pin_url(pin, self.gate.names, [r.url for r in self.replicas.replicas])
        return await self.proxy.handle(endpoint, request, pinned_prepare(self.proxy, endpoint, url))

    async def models(self, request: Request) -> Response:
        auth = header(request, b"authorization")
        data = await self.replicas.models({"authorization": auth} if auth else {})
        return _json({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        n = sum(r.healthy for r in self.replicas.replicas)
        if self.drain.draining:
            return _json({"ready": False, "draining": True, "healthy_replicas": n}, 503)
        return _json({"ready": n > 0, "healthy_replicas": n}, 200 if n else 503)

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def replica_list(self, request: Request) -> Response:
        out = [{**r.as_json(), "index": self.events.status(r.id)} for r in self.replicas.replicas]
        return _json({"policy": self.proxy.policy.name, "mode": self.mode, "replicas": out})

    async def index_lookup(self, request: Request) -> Response:
        """Where the index believes a body's prefix lives (the same chain and lookup as routing).

        ``?endpoint=completions`` for a completions body; chat by default. Read-only.
        """
        endpoint: Endpoint = (
            "completions" if request.query_params.get("endpoint") == "completions" else "chat"
        )
        parsed = parse_request(endpoint, await request.body(), None)
        chain = self.locator.chain(parsed)
        found = await self.locator.residency(chain)
        return _json({"chain_blocks": len(chain), "block_tokens": found.block_tokens,
                      "gpu": dict(found.gpu), "pool": found.pool, "readers": found.readers})

    async def policy(self, request: Request) -> Response:
        return _json(self.proxy.policy.describe())

    async def openapi(self, request: Request) -> Response:
        return _json(openapi_document(tenants=self.gate.tenants is not None,
                                      admin=bool(self.gate.admin_key)))

    def hot_routes(self) -> list[Route]:
        """The proxied routes nearly all traffic takes (served lean: ``router.hotpath``)."""
        wrap = self.gate.wrap
        return [
            Route("/v1/chat/completions", wrap("tenant", self.chat, proxied=True),
                  methods=["POST"]),
            Route("/v1/completions", wrap("tenant", self.completions, proxied=True),
                  methods=["POST"]),
        ]

    def routes(self) -> list[Route]:
        wrap = self.gate.wrap
        extra = canary_routes(self.canary) if self.canary is not None else []
        admin = [Route(r.path, wrap("admin", r.endpoint), methods=r.methods)
                 for r in [*admin_routes(self.admin), *extra]]
        return [
            *self.hot_routes(),
            Route("/v1/models", wrap("tenant", self.models), methods=["GET"]),
            Route("/health", wrap("public", self.health), methods=["GET"]),
            Route("/ready", wrap("public", self.ready), methods=["GET"]),
            Route("/metrics", wrap("public", self.metrics_text), methods=["GET"]),
            Route("/openapi.json", wrap("public", self.openapi), methods=["GET"]),
            Route("/replicas", wrap("internal", self.replica_list), methods=["GET"]),
            Route("/index/lookup", wrap("internal", self.index_lookup), methods=["POST"]),
            Route("/policy", wrap("internal", self.policy), methods=["GET"]),
            *admin,
        ]


def _error_response(err: LmrouteError) -> Response:
    """The one place an ``LmrouteError`` becomes a response."""
    resp = Response(err.body(), status_code=err.status, media_type="application/json")
    if err.request_id:
        resp.headers["x-request-id"] = err.request_id
    if isinstance(err, RateLimited):
        resp.headers["retry-after"] = str(max(1, round(err.retry_after_s)))
    return resp


async def _on_lmroute_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LmrouteError)
    return _error_response(exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _error_response(NotFound(f"no route {request.method} {request.url.path}"))
    return _error_response(BadRequest(str(exc.detail), code=str(exc.status_code),
                                      status=exc.status_code))


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    # The one top-level catch-all: a bug must still answer OpenAI-shaped JSON, and the
    # traceback goes to the log, never to the client.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error_response(LmrouteError("internal router error (logged)", code="internal"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, compiled.exception_handler(_on_http_error))
    app.add_exception_handler(LmrouteError, compiled.exception_handler(_on_lmroute_error))
    app.add_exception_handler(Exception, compiled.exception_handler(_on_unexpected))
