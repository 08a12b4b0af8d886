"""The embedded prefix index: one LRU of block keys per replica GPU and one for the pool.

Each tier is an ``OrderedDict`` from block key to last-seen time, oldest first, bounded by
its capacity in blocks (``IndexCapacity``): ``record`` inserts a chain tail-first so the
head ends most recent, then pops the oldest entries beyond capacity; ``evict`` pops the
given keys (O(keys)). ``lookup`` walks the
chain on the pool and on each replica until the first missing block: O(replicas x matched
blocks), no allocation beyond the result. Memory is bounded by the sum of the capacities
(~100 bytes per entry in CPython). Everything runs inside one event-loop step, so
concurrent coroutines never see a half-applied record.

Parameters: ``capacity``, ``clock`` (seconds; injected so tests and the simulator control
time), ``block_tokens`` (copied into each ``Residency``), ``step_s`` (see base.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import takewhile

from policies.base import DEFAULT_BLOCK_TOKENS, ReplicaId, Residency, Tier
from router.index.base import DEFAULT_STEP_S, BlockKey, IndexCapacity, check_record


class _LruBlocks:
    """Block key -> last-seen time, least recently seen first, at most ``capacity``."""

    __slots__ = ("capacity", "entries")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[BlockKey, float] = OrderedDict()

    def add(self, chain: Sequence[BlockKey], now: float, step_s: float) -> None:
        chain = chain[: self.capacity]
        entries = self.entries
        # Tail first: the head must end up most recent so eviction starts at the tail.
        for i in range(len(chain) - 1, -1, -1):
            key = chain[i]
            entries[key] = now - i * step_s
            entries.move_to_end(key)
        for _ in range(len(entries) - self.capacity):
            entries.popitem(last=False)

    def discard(self, keys: Sequence[BlockKey]) -> None:
        entries = self.entries
        for key in keys:
            entries.pop(key, None)

    def leading(self, chain: Sequence[BlockKey]) -> int:
        # takewhile over the C-level ``__contains__``: ~2x faster than a Python loop on
        # a 512-block (128k-token) chain, for every replica at every decision.
        return len(list(takewhile(self.entries.__contains__, chain)))


class MemoryIndex:
    """In-process ``PrefixIndex``; the default when no Redis URL is configured."""

    def __init__(
        self,
        capacity: IndexCapacity | None = None,
        *,
        clock: Callable[[], float] = time.time,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        step_s: float = DEFAULT_STEP_S,
    ) -> None:
        self.capacity = capacity or IndexCapacity()
        self._clock = clock
        self._block_tokens = block_tokens
        self._step_s = step_s
        self._pool = _LruBlocks(self.capacity.pool_blocks)
        self._gpu: dict[ReplicaId, _LruBlocks] = {}

    async def lookup(self, chain: Sequence[BlockKey]) -> Residency:
        return self.lookup_now(chain)

    def lookup_now(self, chain: Sequence[BlockKey]) -> Residency:
        """Synchronous ``lookup``, for callers without an event loop (the simulator)."""
        gpu: dict[ReplicaId, int] = {}
        for replica, blocks in self._gpu.items():
            count = blocks.leading(chain)
            if count:
                gpu[replica] = count
        return Residency(
            chain_blocks=len(chain),
            block_tokens=self._block_tokens,
            gpu=gpu,
            pool=self._pool.leading(chain),
        )

    async def record(
        self, chain: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        self.record_now(chain, tier, replica)

    def record_now(
        self, chain: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        """Synchronous ``record``."""
        check_record(tier, replica)
        if not chain:
            return
        if replica is None:
            target = self._pool
        else:
            target = self._gpu.get(replica) or self._gpu.setdefault(
                replica, _LruBlocks(self.capacity.gpu_for(replica))
            )
        target.add(chain, self._clock(), self._step_s)

    async def evict(
        self, keys: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        self.evict_now(keys, tier, replica)

    def evict_now(
        self, keys: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        """Synchronous ``evict``."""
        check_record(tier, replica)
        target = self._pool if replica is None else self._gpu.get(replica)
        if target is not None:
            target.discard(keys)

    async def forget(self, replica: ReplicaId) -> None:
        self._gpu.pop(replica, None)

    async def warm(self) -> None:
        return None

    async def close(self) -> None:
        return None
