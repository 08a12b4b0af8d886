"""The streamed reply: each read from the replica goes to the client as one ASGI send.

``Relay`` is the response of a streamed (SSE) proxied request. Per upstream read it does
one ``readany`` on aiohttp's stream and one ``send`` of those bytes, nothing else: no
batching (an event is never held back to join the next), no re-framing, no generator
layers between the socket and the send (Starlette's ``StreamingResponse`` pulled each
chunk through two async generators and ran an anyio task group per request).

Around the loop, the same contract the ``StreamingResponse`` version had:

- the client's disconnect (uvicorn speaks ASGI 2.3: a send after it is silently dropped,
  so the disconnect must be watched) cancels the relay at once, from a
  ``router.disconnect.Cancelling`` watch on ``receive()``; the cancellation is swallowed, as
  Starlette's task group did;
- a replica stream that breaks after bytes reached the client ends with an SSE error
  event (``router.errors.sse_error_event``) and a clean close: there is no retry;
- ``wrap(f)`` lets a route read the bytes as they pass (``f`` maps the chunk iterator to
  one yielding the same chunks: the Responses API learns its response ids this way);
- ``first_byte()`` runs once, at the first body bytes (TTFT); ``finish(ended, ok, tail)`` runs
  exactly once, however the relay ended (``ended``: the replica's stream was read to its
  end; ``ok``: and it did not break; ``tail``: the last two chunks relayed, where the
  reply's ``usage`` is, ``router.usage``), after the upstream connection is released or
  closed. Nothing here refers back to the proxy's closures, so a finished relay is freed
  by reference counting, not left to the cyclic GC.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.disconnect import Cancelling
from router.errors import UpstreamStreamBroken, sse_error_event
from router.forward import Forward
from router.upstream import UpstreamResponse
from router.wire import WireResponse


class Relay(Response):
    def __init__(self, upstream: UpstreamResponse, raw_headers: list[tuple[bytes, bytes]], *,
                 first_byte: Callable[[], None], broken: Callable[[UpstreamStreamBroken], None],
                 finish: Callable[[bool, bool, bytes], None]):
        # Response.__init__ would render a body and headers this response does not have.
        self.status_code = upstream.status
        self.raw_headers = raw_headers
        self.background = None
        self.upstream = upstream
        self._first_byte, self._broken, self._finish = first_byte, broken, finish
        self._wrap: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]] | None = None
        self._forward: Forward | None = None
        self._before = self._last = b""

    def tail(self) -> bytes:
        """The last two chunks relayed (where a reply's ``usage`` is, ``router.usage``)."""
        if self._forward is not None:
            return self._forward.before + self._forward.last
        return self._before + self._last

    def wrap(self, f: Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]]) -> None:
        """Relay ``f(chunks)`` instead of the replica's chunks (after any earlier wrap)."""
        inner = self._wrap
        self._wrap = f if inner is None else (lambda chunks: f(inner(chunks)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = Cancelling(receive)
        ended = ok = False
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            ok = await self._pump(send)
            ended = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watch.ours():
                raise
        finally:
            watch.close()
            self.upstream.abort()
            self._finish(ended, ok, self.tail())

    async def _pump(self, send: Send) -> bool:
        """Relay the replica's bytes until its stream ends; False if it broke."""
        if self._wrap is None and isinstance(self.upstream, WireResponse):
            self._forward = Forward(self.upstream, send, self._first_byte)
            broke = await self._forward.run()
            if broke is None:
                return True
            return await self._break(send, UpstreamStreamBroken(f"replica stream broke: {broke}"))
        first = True
        chunks = self.upstream.chunks()
        if self._wrap is not None:
            chunks = self._wrap(chunks)
        try:
            async for chunk in chunks:
                if first:
                    first = False
                    self._first_byte()
                self._before, self._last = self._last, chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamStreamBroken as exc:
            return await self._break(send, exc)
        return True

    async def _break(self, send: Send, exc: UpstreamStreamBroken) -> bool:
        # Bytes already reached the client: no retry. End with an error event the OpenAI
        # SDKs raise on, then close the stream cleanly.
        self._broken(exc)
        await send({"type": "http.response.body", "body": sse_error_event(exc.message),
                    "more_body": True})
        return False
