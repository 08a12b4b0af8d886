"""The hot routes without FastAPI's per-request layers; the GC set for a long-lived server.

``RouterApp`` is the FastAPI app with one change to ``__call__``: a POST to one of the
paths given to ``serve_hot`` (``/v1/chat/completions``, ``/v1/completions``: nearly all of
a router's traffic) goes straight to that route's endpoint through ``_Lean``, wrapped in
the app's user middleware (the access log). Skipped: FastAPI's per-request telemetry
check (it reads ``os.environ`` on every request), its body-limit and exit-stack
middleware (these routes use neither: ``router.gate`` enforces the body limit),
Starlette's two exception middlewares, the match over every route and the
request/response adapter: five layers, three of which wrapped ``send``, so a streamed
reply paid for them on every event. Any other method, path or scope type (lifespan)
goes to FastAPI. docs/benchmarks.md has the measurement.

``_Lean`` keeps Starlette's error contract, using the app's own handlers: an exception
raised by the endpoint goes to the handler registered for its class (``LmrouteError``,
``HTTPException``: an OpenAI-shaped response); any other goes to the ``Exception``
handler (logged, a 500 sent) and is raised on to the server, as ``ServerErrorMiddleware``
does; an exception once the response is under way is logged the same way and raised.

While draining (``router.drain``: after SIGTERM, during the grace) every response carries
``connection: close``: clients leave this process's keep-alive connections as each
request ends, instead of racing the close of idle ones when the listener shuts (with
``--workers``, their next connection lands on a worker that is not stopping).

``freeze_gc(threshold0)``: after start-up, ``gc.freeze()`` moves every object alive then
(modules, the app, policies, the index) out of the collector's view, so a collection no
longer walks them, and the young-generation threshold is raised from 700 to
``threshold0`` allocations: a request allocates a few hundred container objects, nearly
all freed by reference counting, so the default collected several times per request.
Cycles are still collected, less often.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.drain import Drain
from router.forward import passes_body

GC_THRESHOLD0 = 50_000  # allocations between young collections (CPython's default: 700)


class _Lean:
    """The hot routes' endpoints with Starlette's exception handling, and nothing else."""

    def __init__(self, endpoints: dict[str, Any], handlers: dict[Any, Any], fallback: Any):
        self.endpoints = endpoints
        self.handlers = {k: v for k, v in handlers.items() if isinstance(k, type)}
        self.fallback = fallback

    def _handler(self, exc: Exception) -> Any:
        for cls in type(exc).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self.endpoints[scope["path"]](request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:  # ServerErrorMiddleware: log, answer 500, raise on
                await (await self.fallback(request, exc))(scope, receive, send)
                raise
            await (await handler(request, exc))(scope, receive, send)
            exc.__traceback__ = None  # as Starlette: handled instances may be reused
            return
        try:
            await response(scope, receive, send)
        except Exception as exc:  # the response had started: log it, raise on
            await self.fallback(request, exc)
            raise


class RouterApp(FastAPI):
    """FastAPI, with the hot routes served without its per-request layers."""

    _hot_routes: list[Route]
    _hot_paths: frozenset[str]
    _hot_app: ASGIApp | None
    drain: Drain | None = None

    def serve_hot(self, routes: Iterable[Route], drain: Drain | None = None) -> None:
        """Serve POSTs to these routes' paths through the lean stack (built on first use,
        so middleware added after this call is included); while ``drain`` is draining,
        every response says ``connection: close``."""
        self.drain = drain
        self._hot_routes = list(routes)
        self._hot_paths = frozenset(r.path for r in self._hot_routes)
        self._hot_app = None

    def _build_hot(self) -> ASGIApp:
        handlers = dict(self.exception_handlers)
        fallback = handlers.pop(Exception, None) or handlers.pop(500, None)
        assert fallback is not None, "install_error_handlers(app) registers the catch-all"
        endpoints = {r.path: inspect.unwrap(r.endpoint) for r in self._hot_routes}
        app: ASGIApp = _Lean(endpoints, handlers, fallback)
        for m in reversed(self.user_middleware):
            app = m.cls(app, *m.args, **m.kwargs)
        return app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drain is not None and self.drain.draining and scope["type"] == "http":
            send = closing(send)
        if (scope["type"] == "http" and scope["method"] == "POST" and not self.root_path
                and scope["path"] in getattr(self, "_hot_paths", ())):
            if self._hot_app is None:
                self._hot_app = self._build_hot()
            await self._hot_app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def closing(send: Send) -> Send:
    """``send`` with ``connection: close`` added to the response's head."""

    async def closed(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()),
                                              (b"connection", b"close")]}
        await send(message)

    return passes_body(closed, send)


def freeze_gc(threshold0: int = GC_THRESHOLD0) -> None:
    """Collect once, freeze what survived start-up, and collect the young generation
    every ``threshold0`` net allocations (0: leave the thresholds alone)."""
    gc.collect()
    gc.freeze()
    if threshold0:
        _, t1, t2 = gc.get_threshold()
        gc.set_threshold(threshold0, t1, t2)
