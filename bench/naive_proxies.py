"""Three minimal FastAPI proxies that differ only in the upstream HTTP client.

Used by ``bench/upstream_clients.py`` to choose the client lmroute uses to talk to replicas:

* ``httpx``: ``httpx.AsyncClient`` with its default (httpcore) transport;
* ``httpx-aiohttp``: ``httpx.AsyncClient`` with ``httpx_aiohttp.AiohttpTransport``;
* ``aiohttp``: ``aiohttp.ClientSession`` directly.

Each proxy reads the raw request body, POSTs it to the one backend, and passes a non-streamed
reply through whole or an SSE reply (``text/event-stream``) through chunk by chunk as it
arrives (``StreamingResponse``). One shared client per process, pool limit 512 connections
(all of them may be kept alive), proxy environment variables ignored. ``GET /health`` is
answered locally.

Usage::

    python bench/naive_proxies.py --client aiohttp --port 8100 --backend http://127.0.0.1:8001
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

CLIENTS = ("httpx", "httpx-aiohttp", "aiohttp")
POOL_LIMIT = 512
READ_TIMEOUT_S = 300.0

# The upstream call: (path, body, content type) -> the reply to give the client.
Forward = Callable[[str, bytes, str], Awaitable[Response]]


def _is_sse(content_type: str | None) -> bool:
    return bool(content_type) and "text/event-stream" in str(content_type)


def _httpx_client(backend: str, use_aiohttp_transport: bool) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=POOL_LIMIT, max_keepalive_connections=POOL_LIMIT)
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=10.0, pool=READ_TIMEOUT_S)
    transport: httpx.AsyncBaseTransport | None = None
    if use_aiohttp_transport:
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits, trust_env=False)
    return httpx.AsyncClient(
        base_url=backend, limits=limits, timeout=timeout, trust_env=False, transport=transport
    )


def _httpx_forward(client: httpx.AsyncClient) -> Forward:
    async def forward(path: str, body: bytes, content_type: str) -> Response:
        req = client.build_request("POST", path, content=body, headers={"content-type": content_type})
        upstream = await client.send(req, stream=True)
        ctype = upstream.headers.get("content-type", "application/json")
        if _is_sse(ctype):
            return StreamingResponse(
                upstream.aiter_raw(),
                status_code=upstream.status_code,
                media_type=ctype,
                background=BackgroundTask(upstream.aclose),
            )
        try:
            data = await upstream.aread()
        finally:
            await upstream.aclose()
        return Response(data, status_code=upstream.status_code, media_type=ctype)

    return forward


def _aiohttp_forward(session: aiohttp.ClientSession, backend: str) -> Forward:
    async def forward(path: str, body: bytes, content_type: str) -> Response:
        upstream = await session.post(backend + path, data=body, headers={"content-type": content_type})
        ctype = upstream.headers.get("content-type", "application/json")
        if _is_sse(ctype):
            return StreamingResponse(
                upstream.content.iter_any(),
                status_code=upstream.status,
                media_type=ctype,
                background=BackgroundTask(upstream.release),
            )
        try:
            data = await upstream.read()
        finally:
            upstream.release()
        return Response(data, status_code=upstream.status, media_type=ctype)

    return forward


def build_app(client_kind: str, backend: str) -> FastAPI:
    """A FastAPI app forwarding ``POST /v1/...`` to ``backend`` with the chosen client."""
    if client_kind not in CLIENTS:
        raise ValueError(f"unknown client {client_kind!r}; choose from {CLIENTS}")
    backend = backend.rstrip("/")
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if client_kind == "aiohttp":
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=POOL_LIMIT, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=READ_TIMEOUT_S),
                auto_decompress=False,
                trust_env=False,
            )
            state["forward"] = _aiohttp_forward(session, backend)
            try:
                yield
            finally:
                await session.close()
        else:
            client = _httpx_client(backend, use_aiohttp_transport=client_kind == "httpx-aiohttp")
            state["forward"] = _httpx_forward(client)
            try:
                yield
            finally:
                await client.aclose()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.post("/v1/{rest:path}")
    async def proxy(rest: str, request: Request) -> Response:
        body = await request.body()
        content_type = request.headers.get("content-type", "application/json")
        forward: Forward = state["forward"]
        return await forward("/v1/" + rest, body, content_type)

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="naive FastAPI proxy for client benchmarks")
    parser.add_argument("--client", choices=CLIENTS, required=True)
    parser.add_argument("--backend", required=True, help="e.g. http://127.0.0.1:8001")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(
        build_app(args.client, args.backend),
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        workers=1,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
