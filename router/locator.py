"""Where a request's prefix lives: hash it, look it up, record it once served.

The request path's use of the index, kept out of ``proxy`` so the proxy stays a linear
forwarder:

- ``chain(parsed)``: block keys of the body (``router.prefix``), rooted in the model and
  ``cache_salt``: text mode by default; token mode with a ``ChatTokenizer``
  (``--tokenizer``): the engine's token ids (chat template applied) in ``block_tokens``
  blocks, the keys engine KV events produce (router/events.py). A body the chat template
  refuses gets no chain (routed without locality). A body without ``model`` (vLLM then
  serves its one model) is rooted in ``--served-model`` in token mode, to meet the keys
  the engine's events produce.
- ``residency(chain)``: ONE index lookup, timed and counted by tier; while
  ``pool_trusted`` is false (``router.canary`` found the pool suspect) its pool tier
  reads as 0, so every policy routes as if there were no pool. The index never
  fails a request: ``ResilientIndex`` falls back to memory, and any ``IndexUnavailable``
  left over reads as "nothing cached anywhere".
- ``served(session, chain, replica)``: after a successful reply the serving replica's GPU now
  holds the prefix (unless ``precise(replica)``: that replica's KV events are flowing and
  are the truth about its GPU, a guess would only add false hits), and with
  ``pool_write_through`` (LMCache's default store-on-prefill) so does the shared pool
  (``served_writes``). Recorded in a background task (the client never waits on
  Redis), or at once with the embedded in-memory index, which does no I/O.
- ``dispatched(request_id, chain, replica)`` / ``settled(request_id)``: the router's own
  dispatches count as cached on their replica until their reply ends, or for a replica
  whose KV events flow until its first token (``first_token``) (``router.in_flight``):
  ``residency`` overlays them on what the index says, so a request sharing a prefix
  still being computed follows it.
- ``last_replica(session)``: the replica that last served a session (``SessionMemory``, a
  bounded LRU), which policies use to keep sessions in place (hysteresis).

``served_writes``, ``record_served`` and ``SessionMemory`` are synchronous and free of I/O,
so the simulator (sim/des/cluster.py) keeps its router-side view with exactly this code.
- ``replica_health_changed(replica, healthy)``: an ejected replica's GPU entries are
  forgotten (it is assumed restarted when it comes back).

Capacity (``capacity_from_bytes``): blocks = bytes / (tokens per block x KV bytes per
token); the study's model has 32 KiB of FP8 KV per token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from policies.base import DEFAULT_BLOCK_TOKENS, EMPTY_RESIDENCY, ReplicaId, Residency, Tier
from router.in_flight import InFlightPrefixes
from router.index import IndexCapacity, IndexUnavailable, PrefixIndex
from router.index.memory import MemoryIndex
from router.metrics import RouterMetrics
from router.openai_api import ParsedRequest
from router.prefix import BlockKey, chain_for_body, root_key, token_chain
from router.tokenizer import ChatTokenizer, TemplateFailed


def capacity_from_bytes(gpu_kv_bytes: int, pool_bytes: int, block_tokens: int,
                        kv_bytes_per_token: int) -> IndexCapacity:
    block_bytes = block_tokens * kv_bytes_per_token
    return IndexCapacity(gpu_blocks=max(1, gpu_kv_bytes // block_bytes),
                         pool_blocks=max(1, pool_bytes // block_bytes))


def served_writes(replica: ReplicaId, *, precise: bool,
                  pool_write_through: bool) -> list[tuple[Tier, ReplicaId | None]]:
    """The index writes a successful reply implies: (tier, replica or None for the pool)."""
    writes: list[tuple[Tier, ReplicaId | None]] = []
    if not precise:
        writes.append((Tier.GPU, replica))
    if pool_write_through:
        writes.append((Tier.POOL, None))
    return writes


def record_served(index: MemoryIndex, chain: Sequence[BlockKey], replica: ReplicaId, *,
                  precise: bool, pool_write_through: bool) -> None:
    """Apply ``served_writes`` to an in-memory index at once (it does no I/O)."""
    for tier, holder in served_writes(replica, precise=precise,
                                      pool_write_through=pool_write_through):
        index.record_now(chain, tier, holder)


class SessionMemory:
    """The replica that last served each session, least recently served dropped first."""

    def __init__(self, max_sessions: int = 200_000) -> None:
        self._sessions: OrderedDict[str, ReplicaId] = OrderedDict()
        self._max_sessions = max_sessions

    def remember(self, session: str, replica: ReplicaId) -> None:
        self._sessions[session] = replica
        self._sessions.move_to_end(session)
        if len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)

    def last(self, session: str) -> ReplicaId | None:
        return self._sessions.get(session)


class Locator:
    """The request path's view of the prefix index."""

    def __init__(self, index: PrefixIndex, metrics: RouterMetrics, *, block_bytes: int,
                 pool_write_through: bool, max_sessions: int = 200_000,
                 clock: Callable[[], float] = time.perf_counter,
                 tokenizer: ChatTokenizer | None = None, block_tokens: int = DEFAULT_BLOCK_TOKENS,
                 precise: Callable[[ReplicaId], bool] = lambda replica: False,
                 default_model: str = ""):
        self.index = index
        self.tokenizer = tokenizer
        self.block_tokens = block_tokens
        self.precise = precise
        self.default_model = default_model  # a body without "model": vLLM's served model
        self.pool_trusted = True  # false while the canary holds the pool suspect
        self.metrics = metrics
        self.block_bytes = block_bytes
        self.pool_write_through = pool_write_through
        self._clock = clock
        self.sessions = SessionMemory(max_sessions)
        self.in_flight = InFlightPrefixes()
        self._pending: set[asyncio.Task[None]] = set()

    def chain(self, parsed: ParsedRequest) -> list[BlockKey]:
        return self.prompt_chain(parsed)[0]

    def prompt_chain(self, parsed: ParsedRequest) -> tuple[list[BlockKey], int]:
        """The request's block chain and its prompt's length in tokens: exact in token mode
        (the engine's ids: the index's blocks and the cost model's prompt in one unit),
        else the text's length / 4."""
        estimate = parsed.prompt_chars // 4
        if not parsed.hashed:
            return [], estimate
        if self.tokenizer is None:
            return chain_for_body(parsed.body, parsed.endpoint,
                                  block_bytes=self.block_bytes), estimate
        try:
            ids = self.tokenizer.ids(parsed.body, parsed.endpoint)
        except TemplateFailed:
            self.metrics.index_error("template")
            return [], estimate
        salt = parsed.body.get("cache_salt")
        root = root_key(parsed.model or self.default_model,
                        salt if isinstance(salt, str) else None, None)
        return token_chain(ids, root, self.block_tokens), len(ids)

    async def residency(self, chain: list[BlockKey], *, trusted: bool = False) -> Residency:
        """Where ``chain`` lives (the index, with this router's unsettled dispatches laid
        over it); the pool tier reads as empty while ``pool_trusted`` is false
        (``router.canary``) unless ``trusted`` (the canary's own look)."""
        if not chain:
            return EMPTY_RESIDENCY
        t0 = self._clock()
        try:
            found = await self.index.lookup(chain)
        except IndexUnavailable:
            self.metrics.index_error("lookup")
            return self.in_flight.overlay(EMPTY_RESIDENCY, chain)
        tier = Tier.GPU if found.gpu else Tier.POOL if found.pool else Tier.MISS
        self.metrics.index_lookup(self._clock() - t0, tier.value)
        if found.pool and not (self.pool_trusted or trusted):
            found = dataclasses.replace(found, pool=0)
        return self.in_flight.overlay(found, chain)

    def dispatched(self, request_id: str, chain: list[BlockKey], replica: ReplicaId) -> None:
        self.in_flight.add(request_id, replica, chain)

    def settled(self, request_id: str) -> None:
        self.in_flight.settle(request_id)

    def first_token(self, request_id: str, replica: ReplicaId) -> None:
        """A stream's first token: the prompt is computed. A precise replica's KV events
        (published as its blocks are computed) carry it from here, so its in-flight entry
        goes now rather than when a long decode ends (a 128k-token prompt holds 4,000
        entries); an approximate one's stays until ``served`` records it."""
        if self.precise(replica):
            self.in_flight.settle(request_id)

    def last_replica(self, session: str) -> ReplicaId | None:
        return self.sessions.last(session)

    def served(self, session: str, chain: list[BlockKey], replica: ReplicaId) -> None:
        if session.startswith("n:"):  # a request of no session (embeddings, ...): not kept
            return
        self.sessions.remember(session, replica)
        if not chain:
            return
        if isinstance(self.index, MemoryIndex):  # no I/O: a task per request would cost more
            record_served(self.index, chain, replica, precise=self.precise(replica),
                          pool_write_through=self.pool_write_through)
        else:
            self._background(self._record(chain, replica))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def replica_health_changed(self, replica: ReplicaId, healthy: bool) -> None:
        """An ejected replica is assumed restarted when it comes back: its GPU cache is
        gone, so what the index believes about it is dropped (in the background)."""
        if not healthy:
            self.in_flight.forget(replica)
            self._background(self.forget(replica))

    async def _record(self, chain: list[BlockKey], replica: ReplicaId) -> None:
        writes = served_writes(replica, precise=self.precise(replica),
                               pool_write_through=self.pool_write_through)
        try:
            for tier, holder in writes:
                await self.index.record(chain, tier, holder)
        except IndexUnavailable:
            self.metrics.index_error("record")

    async def forget(self, replica: ReplicaId) -> None:
        try:
            await self.index.forget(replica)
        except IndexUnavailable:
            self.metrics.index_error("forget")

    async def close(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self.index.close()
