"""``create_app(settings)``: compose the router; the lifespan starts and stops what it owns.

Composition only: the parts are built from the settings (``_policy``, ``_index``, ...),
wired together, and handed to the routes (``router.routes``). Everything lives on the app
(``app.state`` and the routes' closure; no module globals), so tests run several routers
in one process.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from policies import registry
from policies.base import Policy
from policies.split import parse_policy_ref
from router.admin import PolicyAdmin
from router.canary import Canary
from router.drain import Drain
from router.events import EngineEvents, EventConfig, KvIngest
from router.gate import Gate
from router.hotpath import RouterApp
from router.index import PrefixIndex, open_index
from router.locator import Locator, capacity_from_bytes
from router.logs import AccessLog
from router.membership import split_backends
from router.metrics import RouterMetrics
from router.passthrough import Surface
from router.proxy import Proxy
from router.replicas import ReplicaSet, ServedModels
from router.routes import Routes, install_error_handlers
from router.settings import Settings
from router.tenants import Tenants
from router.tokenizer import ChatTokenizer
from router.upstream import Upstream

Clock = Callable[[], float]


def _policy(settings: Settings) -> tuple[str, dict[str, Any], Policy]:
    """``--policy NAME[@KEY=VALUE...]``; ``--split S`` is ``@spec=S`` (the split policy's arms:
    any other policy rejects the option, so a stray ``--split`` is an error, not ignored)."""
    name, options = parse_policy_ref(settings.policy)
    if settings.split:
        options = {**options, "spec": settings.split}
    return name, options, registry.create(name, options)


def _index(settings: Settings, block_tokens: int, metrics: RouterMetrics) -> PrefixIndex:
    capacity = capacity_from_bytes(settings.gpu_kv_bytes, settings.pool_bytes,
                                   block_tokens, settings.kv_bytes_per_token)
    return open_index(settings.index, capacity, lookup_timeout_s=settings.index_lookup_timeout_s,
                      lookup_timeout_max_s=settings.index_lookup_timeout_max_s,
                      block_tokens=block_tokens, on_error=metrics.index_error)


def _replicas(settings: Settings, upstream: Upstream, clock: Clock) -> ReplicaSet:
    return ReplicaSet(
        settings.backends, upstream,
        health_interval_s=settings.health_interval_s, health_timeout_s=settings.health_timeout_s,
        eject_after=settings.eject_after, readmit_after=settings.readmit_after,
        scrape_interval_s=settings.scrape_interval_s, clock=clock,
        max_ejection_percent=settings.max_ejection_percent,
    )


def _gate(settings: Settings, replicas: ReplicaSet) -> Gate:
    tenants = Tenants.from_file(settings.api_keys) if settings.api_keys else None
    names = None if settings.expose_replica_header else {
        r.url: f"r{i}" for i, r in enumerate(replicas.replicas)}
    return Gate(tenants=tenants, admin_key=settings.admin_key,
                max_body_bytes=settings.max_body_bytes, replica_names=names)


def _events(settings: Settings, config: EventConfig, index: PrefixIndex, upstream: Upstream,
            metrics: RouterMetrics, block_tokens: int) -> EngineEvents:
    """The KV-event subscribers: the static replicas' now, joining ones' from ``config``."""
    served = ServedModels(upstream, settings.health_timeout_s, settings.served_model)
    ingest = KvIngest(index, served, block_tokens=block_tokens,
                      max_blocks=settings.kv_events_max_blocks, on_error=metrics.index_error,
                      local_media=settings.kv_events_local_media)
    sources = [s for b in settings.backends for s in config.sources_for(b)]
    return EngineEvents(sources, ingest, topic=settings.kv_events_topic, config=config)


def _canary(settings: Settings, replicas: ReplicaSet, upstream: Upstream, locator: Locator,
            metrics: RouterMetrics, clock: Clock) -> Canary:
    """The live canary; off (rate 0) without a pool to check."""
    return Canary(rate=settings.canary_rate if settings.pool_bytes > 0 else 0.0,
                  budget=settings.canary_budget, clean_to_clear=settings.canary_clean_to_clear,
                  tol=settings.canary_logprob_tol, max_tokens=settings.canary_max_tokens,
                  replicas=replicas, upstream=upstream, locator=locator, metrics=metrics,
                  clock=clock)


def _event_config(settings: Settings, dns: list[str], *, tokenized: bool) -> EventConfig:
    """Where KV events come from; replicas may join at run time (admin API, file, DNS) and
    then get their sources from this config."""
    config = EventConfig.parse(settings.backends, settings.kv_events, settings.kv_events_replay,
                               dynamic=bool(settings.admin_key or settings.backends_file or dns))
    if config.enabled and not tokenized:
        raise ValueError("--kv-events needs --tokenizer: event keys are token-mode keys")
    return config


def _lifespan(upstream: Upstream, index: PrefixIndex, replicas: ReplicaSet,
              events: EngineEvents, surface: Surface, canary: Canary, locator: Locator
              ) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the background parts in order; stop them in reverse."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await upstream.start()
        await index.warm()
        replicas.start()
        events.start()
        surface.start()
        try:
            yield
        finally:
            await canary.stop()
            await surface.stop()
            await events.stop()
            await replicas.stop()
            await upstream.close()
            await locator.close()

    return lifespan


def create_app(settings: Settings, *, clock: Clock = time.monotonic) -> FastAPI:
    """Build the router app for ``settings``; nothing starts until the lifespan runs."""
    if not settings.backends and not settings.backends_file:
        raise ValueError("at least one --backend (or --backends-file) is required")
    urls, dns = split_backends(settings.backends)  # dns+ names: router.membership
    settings = dataclasses.replace(settings, backends=tuple(urls))
    policy_name, policy_options, policy = _policy(settings)
    upstream = Upstream(settings.connect_timeout_s, settings.first_byte_timeout_s,
                        keepalive_s=settings.upstream_keepalive_s)
    replicas = _replicas(settings, upstream, clock)
    metrics = RouterMetrics(replicas)
    # Token mode hashes the engine's token ids; text mode about four bytes of text per token.
    tokenizer = ChatTokenizer.from_dir(settings.tokenizer) if settings.tokenizer else None
    block_tokens = settings.block_tokens if tokenizer else settings.block_bytes // 4
    config = _event_config(settings, dns, tokenized=tokenizer is not None)
    index = _index(settings, block_tokens, metrics)
    metrics.watch_index(index)
    events = _events(settings, config, index, upstream, metrics, block_tokens)
    locator = Locator(index, metrics, block_bytes=settings.block_bytes,
                      pool_write_through=settings.pool_write_through and settings.pool_bytes > 0,
                      tokenizer=tokenizer, block_tokens=block_tokens, precise=events.precise,
                      default_model=settings.served_model)
    replicas.on_health_change = lambda r: locator.replica_health_changed(r.id, r.healthy)
    proxy = Proxy(replicas=replicas, upstream=upstream, policy=policy, locator=locator,
                  metrics=metrics, clock=clock, max_body_bytes=settings.max_body_bytes,
                  max_attempts=settings.max_attempts)
    admin = PolicyAdmin(proxy, policy_name, policy_options)
    canary = _canary(settings, replicas, upstream, locator, metrics, clock)
    gate = _gate(settings, replicas)
    surface = Surface.build(settings, proxy=proxy, replicas=replicas, upstream=upstream,
                            gate=gate, dns=dns)
    surface.membership.watchers.append(events)  # joining replicas get KV-event subscribers

    lifespan = _lifespan(upstream, index, replicas, events, surface, canary, locator)
    app = RouterApp(title="lmroute", lifespan=lifespan, docs_url=None, redoc_url=None,
                    openapi_url=None)
    drain = Drain()  # set on SIGTERM by router.drain.DrainingServer
    routes = Routes(proxy, replicas, metrics, locator, events, admin, gate,
                    mode="token" if tokenizer else "text", drain=drain, canary=canary)
    app.router.routes.extend([*routes.routes(), *surface.routes()])
    app.serve_hot(routes.hot_routes(), drain)  # chat and completions: router.hotpath
    install_error_handlers(app)
    if settings.access_log:
        app.add_middleware(AccessLog)
    app.state.settings = settings
    app.state.proxy = proxy
    app.state.admin = admin
    app.state.gate = gate
    app.state.drain = drain
    app.state.canary = canary
    return app
