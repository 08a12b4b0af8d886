"""A served request leaves no reference cycles behind, and watching for the client's
disconnect costs no task.

The router freezes the GC's view of start-up and collects young objects rarely
(``router.hotpath.freeze_gc``): anything a request leaves in a reference cycle waits for
a collection that walks every young object, a pause of tens of milliseconds under load.
So a request's objects must be freed by reference counting alone. The router runs here
in this process (a real uvicorn server on 127.0.0.1, in front of a real emulated replica)
so that the GC's own record of what it had to collect can be read.
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from collections.abc import Callable

import httpx
import orjson
import uvicorn
from servers import Server, replica
from servers_redis import free_port
from starlette.types import Message, Receive

from router.app import create_app
from router.disconnect import Watch
from router.settings import Settings

PER_REQUEST = {"Relay", "Forward", "WireResponse", "Watch", "Cancelling", "_Attempt", "RequestView",
               "Decision", "RequestResponseCycle", "ParsedRequest", "Outcome"}


async def _requests(url: str, n: int) -> None:
    async with httpx.AsyncClient(timeout=30.0) as client:
        for i in range(n):
            body = {"model": "emulated-27b", "max_tokens": 4, "stream": i % 2 == 0,
                    "messages": [{"role": "user", "content": f"turn {i} " + "x" * 300}]}
            resp = await client.post(url + "/v1/chat/completions", content=orjson.dumps(body),
                                     headers={"content-type": "application/json"})
            assert resp.status_code == 200, resp.text
            if body["stream"]:
                assert resp.text.rstrip().endswith("data: [DONE]")


async def test_served_requests_leave_no_cyclic_garbage(
        start_servers: Callable[[Server], Server]) -> None:
    rep = start_servers(replica())
    for policy in ("round_robin", "locality"):
        app = create_app(Settings(backends=(rep.url,), policy=policy))
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="on"))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.02)
            url = f"http://127.0.0.1:{port}"
            await _requests(url, 6)  # warm: connections open, lazy state built
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                await _requests(url, 20)
                gc.collect()
                found = Counter(type(o).__name__ for o in gc.garbage)
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
            leaked = {name: n for name, n in found.items() if name in PER_REQUEST}
            assert not leaked, f"{policy}: per-request objects freed only by the GC: {leaked}"
        finally:
            server.should_exit = True
            await task


def _receive_after(event: asyncio.Event, log: list[str]) -> Receive:
    """An ASGI receive as uvicorn's: the body first, then a wait for the connection's end."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        log.append("receive")
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await event.wait()
        return {"type": "http.disconnect"}

    return receive


async def test_watch_sees_the_disconnect_once_and_runs_no_task() -> None:
    gone_event, calls, log = asyncio.Event(), list[str](), list[str]()
    tasks = len(asyncio.all_tasks())
    watch = Watch(_receive_after(gone_event, log), lambda: calls.append("gone"))
    assert log == ["receive", "receive"]  # the body message is skipped, then it waits
    assert len(asyncio.all_tasks()) == tasks and calls == []
    await asyncio.sleep(0.01)
    assert calls == []
    gone_event.set()
    await asyncio.sleep(0)  # the event's future runs its callbacks on the next round
    await asyncio.sleep(0)
    assert calls == ["gone"]
    watch.close()  # after the end: harmless
    assert calls == ["gone"]


async def test_a_closed_watch_never_fires_and_leaves_no_waiter() -> None:
    gone_event, calls, log = asyncio.Event(), list[str](), list[str]()
    watch = Watch(_receive_after(gone_event, log), lambda: calls.append("gone"))
    assert len(gone_event._waiters) == 1
    watch.close()
    assert not gone_event._waiters
    gone_event.set()
    await asyncio.sleep(0.01)
    assert calls == []


async def test_a_client_already_gone_is_seen_at_once() -> None:
    calls: list[str] = []

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    Watch(receive, lambda: calls.append("gone"))
    assert calls == ["gone"]
