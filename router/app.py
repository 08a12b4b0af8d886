"""``create_app(settings)``: build the router; the lifespan starts and stops what it owns.

Everything lives on ``app.state`` (no module globals), so tests run several routers in
one process. The chat/completions routes are plain Starlette routes taking the raw
request: FastAPI's body validation stays off the hot path (``openai_api`` parses bytes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from policies import registry
from policies.split import parse_policy_ref
from router.admin import PolicyAdmin, admin_routes
from router.errors import LmrouteError, NoHealthyReplica, NotFound, error_body
from router.events import EngineEvents, KvIngest, parse_sources
from router.index import open_index
from router.locator import Locator, capacity_from_bytes
from router.metrics import RouterMetrics
from router.openai_api import Endpoint, parse_request
from router.proxy import Proxy, error_response
from router.replicas import Replica, ReplicaSet, list_models
from router.settings import Settings
from router.tokenizer import ChatTokenizer
from router.upstream import Upstream

Clock = Callable[[], float]


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def create_app(settings: Settings, *, clock: Clock = time.monotonic) -> FastAPI:
    """Build the router app for ``settings``; nothing starts until the lifespan runs."""
    if not settings.backends:
        raise ValueError("at least one --backend is required")
    # ``--policy NAME[@KEY=VALUE...]``; ``split`` takes its arms from ``--split``.
    policy_name, policy_options = parse_policy_ref(settings.policy)
    if policy_name == "split":
        policy_options = {"spec": settings.split}
    policy = registry.create(policy_name, policy_options or None)
    upstream = Upstream(settings.connect_timeout_s, settings.first_byte_timeout_s)
    replicas = ReplicaSet(
        settings.backends,
        upstream,
        health_interval_s=settings.health_interval_s,
        health_timeout_s=settings.health_timeout_s,
        eject_after=settings.eject_after,
        readmit_after=settings.readmit_after,
        scrape_interval_s=settings.scrape_interval_s,
        clock=clock,
    )
    metrics = RouterMetrics(replicas)
    # Token mode hashes the engine's token ids; text mode about four bytes of text per token.
    tokenizer = ChatTokenizer.from_dir(settings.tokenizer) if settings.tokenizer else None
    block_tokens = settings.block_tokens if tokenizer else settings.block_bytes // 4
    sources = parse_sources(settings.backends, settings.kv_events, settings.kv_events_replay)
    if sources and tokenizer is None:
        raise ValueError("--kv-events needs --tokenizer: event keys are token-mode keys")
    capacity = capacity_from_bytes(settings.gpu_kv_bytes, settings.pool_bytes,
                                   block_tokens, settings.kv_bytes_per_token)
    index = open_index(
        settings.index, capacity, lookup_timeout_s=settings.index_lookup_timeout_s,
        block_tokens=block_tokens,
        on_error=lambda kind: metrics.index_errors.labels(kind).inc(),
    )
    served_models: dict[str, str] = {}

    async def model_of(replica_id: str) -> str | None:
        """The model name rooting a replica's event keys: configured, else its /v1/models."""
        if settings.served_model:
            return settings.served_model
        if replica_id not in served_models:
            data = await list_models(upstream, replica_id, settings.health_timeout_s)
            base = [m for m in data if not m.get("parent")]
            if not base:
                return None
            served_models[replica_id] = str(base[0].get("id"))
        return served_models[replica_id]

    events = EngineEvents(
        sources,
        KvIngest(index, model_of, block_tokens=block_tokens,
                 max_blocks=settings.kv_events_max_blocks),
        topic=settings.kv_events_topic,
    )
    locator = Locator(index, metrics, block_bytes=settings.block_bytes,
                      pool_write_through=settings.pool_write_through and settings.pool_bytes > 0,
                      tokenizer=tokenizer, block_tokens=block_tokens, precise=events.precise)

    forgetting: set[asyncio.Task[None]] = set()

    def on_health_change(replica: Replica) -> None:
        # An ejected replica is assumed restarted when it comes back: its GPU cache is gone.
        if not replica.healthy:
            task = asyncio.get_running_loop().create_task(locator.forget(replica.id))
            forgetting.add(task)
            task.add_done_callback(forgetting.discard)

    replicas.on_health_change = on_health_change
    proxy = Proxy(
        replicas=replicas, upstream=upstream, policy=policy, locator=locator, metrics=metrics,
        clock=clock,
        max_body_bytes=settings.max_body_bytes, max_attempts=settings.max_attempts,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await upstream.start()
        await index.warm()
        replicas.start()
        events.start()
        try:
            yield
        finally:
            await events.stop()
            await replicas.stop()
            await upstream.close()
            await locator.close()

    app = FastAPI(title="lmroute", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.settings = settings
    app.state.proxy = proxy
    app.state.replicas = replicas
    app.state.metrics = metrics
    app.state.locator = locator
    app.state.events = events
    admin = PolicyAdmin(proxy, settings.admin_key, policy_name, policy_options)
    app.state.admin = admin

    async def chat(request: Request) -> Response:
        return await proxy.handle("chat", request)

    async def completions(request: Request) -> Response:
        return await proxy.handle("completions", request)

    async def models(request: Request) -> Response:
        """Union of the healthy replicas' models, first replica's entry wins per id."""
        auth = request.headers.get("authorization")
        hdrs = {"authorization": auth} if auth else {}
        healthy = [r for r in replicas.replicas if r.healthy]
        if not healthy:
            return error_response(NoHealthyReplica("no healthy replica to list models from"))

        seen: dict[str, dict[str, Any]] = {}
        listed = await asyncio.gather(
            *(list_models(upstream, r.url, settings.health_timeout_s, hdrs) for r in healthy))
        for found in listed:
            for m in found:
                seen.setdefault(str(m["id"]), m)
        return _json({"object": "list", "data": list(seen.values())})

    async def health(request: Request) -> Response:
        return _json({"status": "ok"})

    async def ready(request: Request) -> Response:
        n = sum(r.healthy for r in replicas.replicas)
        return _json({"ready": n > 0, "healthy_replicas": n}, 200 if n else 503)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def replicas_endpoint(request: Request) -> Response:
        out = [{**r.as_json(), "index": events.status(r.id)} for r in replicas.replicas]
        return _json({"policy": proxy.policy.name, "mode": "token" if tokenizer else "text",
                      "replicas": out})

    async def index_lookup(request: Request) -> Response:
        """Where the index believes a body's prefix lives (the same chain and lookup as routing).

        ``?endpoint=completions`` for a completions body; chat by default. Read-only.
        """
        endpoint: Endpoint = (
            "completions" if request.query_params.get("endpoint") == "completions" else "chat"
        )
        try:
            parsed = parse_request(endpoint, await request.body(), None)
        except LmrouteError as err:
            return error_response(err)
        chain = locator.chain(parsed)
        found = await locator.residency(chain)
        return _json({"chain_blocks": len(chain), "block_tokens": found.block_tokens,
                      "gpu": dict(found.gpu), "pool": found.pool})

    app.add_route("/v1/chat/completions", chat, methods=["POST"])
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/models", models, methods=["GET"])
    app.add_route("/health", health, methods=["GET"])
    app.add_route("/ready", ready, methods=["GET"])
    app.add_route("/metrics", metrics_endpoint, methods=["GET"])
    app.add_route("/replicas", replicas_endpoint, methods=["GET"])
    app.add_route("/index/lookup", index_lookup, methods=["POST"])

    async def policy_endpoint(request: Request) -> Response:
        return _json(proxy.policy.describe())

    app.add_route("/policy", policy_endpoint, methods=["GET"])
    app.router.routes.extend(admin_routes(admin))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return error_response(NotFound(f"no route {request.method} {request.url.path}"))
        body = error_body(str(exc.detail), "invalid_request_error", None, str(exc.status_code))
        return Response(body, status_code=exc.status_code, media_type="application/json")

    async def on_lmroute_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LmrouteError)
        return error_response(exc)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # The one top-level catch-all: a bug must still answer OpenAI-shaped JSON.
        body = error_body(f"internal router error: {exc!r}", "internal_error", None, "internal")
        return Response(body, status_code=500, media_type="application/json")

    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(LmrouteError, on_lmroute_error)
    app.add_exception_handler(Exception, on_unexpected)
    return app
