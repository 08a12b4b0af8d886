"""A streamed reply's chunks after the first are written to the client's socket past
uvicorn's ``send`` (router.forward), and the client gets exactly what ``send`` would
have given it.

The router runs in this process (a real uvicorn server with the CLI's protocol, on
127.0.0.1, in front of a real emulated replica in its own process), so that the calls to
uvicorn's ``RequestResponseCycle.send`` can be counted: with the direct writes a stream of
many events costs three (the head, the first body bytes, the end), whatever its length.
The access log is on, as by default: its ``send`` wrapper must not turn the writes off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from servers import Server, replica, sse_data
from servers_redis import free_port
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from router.app import create_app
from router.framing import JsonFramingProtocol
from router.logs import ACCESS
from router.settings import Settings

BODY = {"model": "emulated-27b", "prompt": "count the stars", "max_tokens": 40,
        "stream": True, "ignore_eos": True}


def _texts(stream: bytes) -> list[str]:
    return [orjson.loads(e)["choices"][0]["text"] for e in sse_data(stream)]


async def test_stream_chunks_bypass_send_and_arrive_whole(
        start_servers: Callable[[Server], Server], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    rep = start_servers(replica("--ttft", "0.05", "--tpot", "0.005"))
    async with httpx.AsyncClient(timeout=30.0) as client:
        direct = (await client.post(rep.url + "/v1/completions", json=BODY)).content

    sends: list[str] = []
    original = RequestResponseCycle.send

    async def counted(self: RequestResponseCycle, message: Any) -> None:
        sends.append(message["type"])
        await original(self, message)

    monkeypatch.setattr(RequestResponseCycle, "send", counted)
    monkeypatch.setattr(ACCESS, "level", logging.INFO)
    app = create_app(Settings(backends=(rep.url,), policy="round_robin"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on",
                                           log_level="warning", http=JsonFramingProtocol))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.02)
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=30.0) as client:
            for _ in range(2):  # the second on a kept-alive client connection
                sends.clear()
                with caplog.at_level(logging.INFO, logger="lmroute.access"):
                    relayed = (await client.post(url + "/v1/completions", json=BODY)).content
                assert _texts(relayed) == _texts(direct)
                assert len(_texts(relayed)) == 40
                # head, first body bytes, end (and at most a few read before the hand-over)
                assert sends[0] == "http.response.start"
                assert 3 <= len(sends) <= 6, sends
            access = [r for r in caplog.records if r.name == "lmroute.access"]
            assert access and access[-1].access["status"] == 200  # type: ignore[attr-defined]
            assert access[-1].access["ttft_s"] > 0  # type: ignore[attr-defined]
    finally:
        server.should_exit = True
        await task
