"""Cancel work nobody will read: a client that disconnects cancels its upstream request.

uvicorn does not cancel a handler when its client goes away; it only answers
``http.disconnect`` to the next ``receive()``. ``Watch(receive, on_gone)`` watches for that
answer without a task of its own. ``unless_gone(work, receive)`` runs the request's
upstream phase (waiting for the replica's headers, reading a non-streamed body) under a
``Watch`` that cancels the request's task on a disconnect; cancelling the upstream request
closes its connection, which is how vLLM learns to abort the request and free its KV
blocks. Once a stream's headers went out, ``router.relay`` watches the same way and its
cleanup closes the upstream stream.

The request's body has been read before (``router.gate`` reads it), so a ``Watch`` skips
any other message and waits for ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

from starlette.types import Message, Receive, Scope

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's status for "client closed request", in the access log


class ClientGone(Exception):
    """The client disconnected before its reply started; the upstream work was cancelled."""


def steppable(step: Awaitable[T]) -> Coroutine[Any, Any, T]:
    """``step`` as a coroutine, which can be stepped by hand (``send(None)``). uvicorn's
    ``receive()`` and ``send()`` return coroutines; another ASGI server's may return any
    awaitable (granian's have no ``send``): such a one is awaited by a coroutine of ours."""
    if hasattr(step, "send"):
        return cast(Coroutine[Any, Any, T], step)
    return _awaited(step)


async def _awaited(step: Awaitable[T]) -> T:
    return await step


class Watch:
    """Calls ``on_gone()`` once ``receive()`` answers ``http.disconnect``, without a task.

    The ``receive()`` coroutine is stepped by hand (``coro.send(None)``); when it suspends
    on a future (uvicorn's: the connection's message event), the next step is that
    future's done callback. Other messages (a body already read) are skipped and
    ``receive()`` is asked again. A watcher task cost a task, two steps (start and
    cancellation) and two event-loop rounds per request; this costs one coroutine and
    one callback. ``close()`` stops watching (the coroutine is closed, which removes its
    waiter from the event). An exception from ``receive()`` ends the watch silently, as
    it ended the watcher task.
    """

    __slots__ = ("_blocker", "_coro", "_on_gone", "_receive")

    def __init__(self, receive: Receive, on_gone: Callable[[], None] | None = None):
        self._receive, self._on_gone = receive, on_gone
        self._blocker: Any = None
        self._coro: Coroutine[Any, Any, Message] | None = self._ask()
        self._step(None)

    def _ask(self) -> Coroutine[Any, Any, Message]:
        return steppable(self._receive())

    def _step(self, _done: Any) -> None:
        self._blocker = None
        while (coro := self._coro) is not None:
            try:
                blocker = coro.send(None)
            except StopIteration as stop:
                if stop.value.get("type") == "http.disconnect":
                    self._coro = None
                    self._gone()
                    return
                self._coro = self._ask()
                continue
            except BaseException:  # receive broke: there is nothing to watch
                self._coro = None
                return
            if blocker is None:  # a bare yield (asyncio.sleep(0)): step again next round
                self._blocker = asyncio.get_running_loop().call_soon(self._step, None)
            else:
                blocker.add_done_callback(self._step)
                self._blocker = blocker
            return

    def _gone(self) -> None:
        """The client left (a subclass may act here instead of through ``on_gone``)."""
        if self._on_gone is not None:
            self._on_gone()

    def close(self) -> None:
        coro, self._coro = self._coro, None
        blocker, self._blocker = self._blocker, None
        if isinstance(blocker, asyncio.Handle):
            blocker.cancel()
        elif blocker is not None:
            blocker.remove_done_callback(self._step)
        if coro is not None:
            coro.close()


class Cancelling(Watch):
    """A ``Watch`` that cancels the task it was made in when the client leaves, the way
    ``asyncio.timeout`` does: while a ``CancelledError`` is handled, ``ours()`` tells this
    watch's cancellation from anyone else's (``uncancel``). The task is cancelled by a
    method, not a callback bound to this object, so no reference cycle is left behind."""

    __slots__ = ("gone", "task")

    def __init__(self, receive: Receive):
        task = asyncio.current_task()
        assert task is not None
        self.task, self.gone = task, False
        super().__init__(receive)

    def _gone(self) -> None:
        self.gone = True
        self.task.cancel()

    def ours(self) -> bool:
        return self.gone and self.task.uncancel() == 0


async def unless_gone(work: Coroutine[Any, Any, T], receive: Receive) -> T:
    """``await work``, unless the client disconnects first: then ``work`` is cancelled (its
    own cleanup runs, in this task) and ``ClientGone`` is raised.

    A ``Cancelling`` watch on ``receive()`` cancels this task: a version running ``work``
    as a second task under ``asyncio.wait`` cost about 130 us more per request.
    """
    watch = Cancelling(receive)
    try:
        result = await work
    except asyncio.CancelledError:
        if watch.ours():
            raise ClientGone("client disconnected") from None
        raise
    finally:
        watch.close()
    if watch.gone:  # cancelled, but the work had swallowed it and finished
        watch.task.uncancel()
    return result


def mark_gone(scope: Scope) -> None:
    """Note in the request's scope that its client left (the access log says 499)."""
    state = scope.get("state")
    if isinstance(state, dict):
        state["client_gone"] = True
