"""Callables handed to Starlette, kept plain Python so the code they wrap may be compiled.

Starlette decides how to call what it is given by inspecting it: a ``Route``'s endpoint
is called as ``endpoint(request)`` only if ``inspect.isfunction`` or ``inspect.ismethod``
says so (anything else is called as an ASGI app, ``app(scope, receive, send)``), and an
exception handler is awaited only if ``asyncio.iscoroutinefunction`` says so (anything
else runs in a thread pool). A function compiled by mypyc (``setup.py``, ``make fast``)
is neither, so each endpoint and handler the router registers goes through one of these
shims, defined here, in a module that is never compiled. The hot routes
(``router.hotpath``) call the wrapped endpoint itself (``inspect.unwrap``), without the shim.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

Endpoint = Callable[[Request], Awaitable[Response]]
ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


def endpoint(f: Endpoint) -> Endpoint:
    """``f`` as a Python coroutine function Starlette calls with the request."""

    @functools.wraps(f)  # sets __wrapped__: inspect.unwrap finds ``f``
    async def call(request: Request) -> Response:
        return await f(request)

    return call


def exception_handler(f: ExceptionHandler) -> ExceptionHandler:
    """``f`` as a Python coroutine function Starlette awaits on its event loop."""

    @functools.wraps(f)
    async def call(request: Request, exc: Exception) -> Response:
        return await f(request, exc)

    return call
