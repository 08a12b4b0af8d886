"""A streamed reply forwarded from the replica's socket callback, without a task switch.

``Forward.run`` hands a ``router.wire.WireResponse`` a sink: from then on each upstream
read (``Conn.data_received`` -> httptools -> ``chunk``) is sent to the client right there,
by stepping the ASGI ``send`` coroutine by hand (``coro.send(None)``). A send that
completes without suspending (the common case: uvicorn's ``send`` only awaits when the
client's socket pushes back) costs no future, no event-loop round and no task step: the
read and the write happen in one callback, as in an event-driven proxy.

When a send does suspend (the client is slow), the replica's socket stops being read
(``pause_reading``) and a task finishes that send, then the reads that arrived meanwhile
in order (``pending``), then resumes reading: no event is dropped or reordered, and a
slow client slows its replica's socket, not the router's memory.

**Writing to the client's socket directly.** Once the response's head and first body bytes
have gone through the ASGI ``send`` (so every middleware saw them), later chunks are
written by ``Forward`` itself as HTTP/1.1 chunks on the client's transport, when the server
is uvicorn's httptools protocol, the response is chunked and ``send`` is uvicorn's own or a
wrapper that declared itself transparent after the head (``passes_body``: the access log,
the drain's ``connection: close``). That is what uvicorn's ``send`` would write (its chunk
framing keeps no state between messages), without a coroutine, a message dict and the
send's checks per event. Where uvicorn would do something else the normal ``send`` runs:
while the client's socket pushes back (it then waits for the drain), and a chunk for a
client that left is dropped, as uvicorn drops it. The end of the reply always goes through
``send``. Any other server, or a uvicorn whose request cycle lacks what this reads, gets
the plain ``send`` path.

``run`` returns ``None`` once the reply ended, or the error text if the replica's stream
broke (``router.relay`` then ends the client's stream with an SSE error event); an
exception from ``send`` is raised from ``run``. Cancelling ``run`` (the client left)
detaches the sink first, so no send happens after it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import Send
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from router.disconnect import steppable
from router.wire import WireResponse

_AFTER_HEAD = "lmroute_after_head"  # the attribute naming a wrapper's inner send


def passes_body(wrapper: Send, inner: Send) -> Send:
    """Declare ``wrapper`` transparent once the head and the first body bytes went through
    it: later body chunks may go to ``inner`` (or be written past it) directly."""
    setattr(wrapper, _AFTER_HEAD, inner)
    return wrapper


def _direct_cycle(send: Send) -> Any:
    """uvicorn's request cycle under ``send`` and its transparent wrappers, if chunks may
    be written to its client directly (a chunked reply, its head sent), else None."""
    while (inner := getattr(send, _AFTER_HEAD, None)) is not None:
        send = inner
    cycle = getattr(send, "__self__", None)
    if (not isinstance(cycle, RequestResponseCycle)
            or getattr(send, "__func__", None) is not RequestResponseCycle.send):
        return None
    if not all(hasattr(cycle, a) for a in ("transport", "flow", "disconnected",
                                           "chunked_encoding", "scope")):
        return None
    if cycle.chunked_encoding is not True or cycle.scope["method"] == "HEAD":
        return None
    return cycle


class Forward:
    def __init__(self, resp: WireResponse, send: Send, first_byte: Callable[[], None]):
        self.resp, self.send, self.first_byte = resp, send, first_byte
        self.first = True
        self.busy = False  # a send is suspended: reads are paused and chunks wait in pending
        self.pending: deque[bytes] = deque()
        self.ended: tuple[str | None] | None = None  # (error or None) once the reply ended
        self.done: asyncio.Future[str | None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.before = self.last = b""  # the last two chunks sent: the reply's usage is there
        self.cycle: Any = None  # set once chunks may be written to the client directly

    async def run(self) -> str | None:
        loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        try:
            # What arrived before the hand-over goes first, the ordinary way.
            while (chunk := self.resp.take()) is not None:
                await self._send(chunk)
            state = self.resp.attach(self)  # no await since take(): nothing can slip between
            if state is not None:
                return state[0]
            return await self.done
        finally:
            self.resp.detach()
            if self.task is not None:
                self.task.cancel()

    # -- called from the connection's callbacks ---------------------------------------
    def chunk(self, data: bytes) -> None:
        if self.busy:
            self.pending.append(data)
            return
        cycle = self.cycle
        if cycle is not None and not cycle.flow.write_paused:
            self.before, self.last = self.last, data
            # uvicorn drops a send after the client left; an empty chunk would end the body
            if data and not cycle.disconnected:
                cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
            return
        # Stepped by hand: uvicorn's send and every middleware's return a coroutine; another
        # ASGI server's may return any awaitable (``steppable``).
        coro = steppable(self.send(self._message(data)))
        try:
            blocker = coro.send(None)
        except StopIteration:
            return
        except BaseException as exc:
            self._settle(exc)
            return
        self.busy = True
        self.resp.pause_reading()
        assert self.done is not None
        self.task = self.done.get_loop().create_task(self._finish(coro, blocker))

    def end(self, error: str | None) -> None:
        self.ended = (error,)
        if not self.busy:
            self._settle(error)

    # -- the slow path ----------------------------------------------------------------
    async def _finish(self, coro: Coroutine[Any, Any, None], blocker: Any) -> None:
        """Drive the suspended send to its end, then the pending chunks, then read on."""
        try:
            while True:
                try:
                    if blocker is None:  # a bare yield (asyncio.sleep(0))
                        await asyncio.sleep(0)
                    else:
                        # What a Task does with a future its coroutine yields: the flag
                        # says "yielded, not yet taken"; awaiting it again requires it reset.
                        blocker._asyncio_future_blocking = False
                        await blocker
                except asyncio.CancelledError:
                    raise
                except BaseException:  # the send's own await re-raises it, below
                    pass
                try:
                    blocker = coro.send(None)
                except StopIteration:
                    break
            while self.pending:
                await self._send(self.pending.popleft())
        except asyncio.CancelledError:
            coro.close()
            raise
        except BaseException as exc:
            self._settle(exc)
            return
        self.busy = False
        if self.ended is not None:
            self._settle(self.ended[0])
        else:
            self.resp.resume_reading()

    async def _send(self, data: bytes) -> None:
        await self.send(self._message(data))

    def _message(self, data: bytes) -> dict[str, Any]:
        """The ASGI body message for ``data``; the first one also marks the first byte."""
        if self.first:
            self.first = False
            self.first_byte()
            self.cycle = _direct_cycle(self.send)  # the head was sent: its framing is known
        self.before, self.last = self.last, data
        return {"type": "http.response.body", "body": data, "more_body": True}

    def _settle(self, outcome: str | BaseException | None) -> None:
        done = self.done
        if done is None or done.done():
            return
        if isinstance(outcome, BaseException):
            done.set_exception(outcome)
        else:
            done.set_result(outcome)
