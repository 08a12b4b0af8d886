"""The embedded prefix index: one LRU of block keys per replica GPU and one for the pool.

Each tier is an ``OrderedDict`` from block key to a stamp, oldest first (the position is
the recency), bounded by its capacity in blocks (``IndexCapacity``): ``record`` inserts a
chain tail-first so the head ends most recent, then pops the oldest entries beyond
capacity; ``evict`` pops the given keys (O(keys)). Memory is bounded by the sum of the
capacities (~100 bytes per entry in CPython). Everything runs inside one event-loop step,
so concurrent coroutines never see a half-applied record.

Lookup: the length of the chain's leading run present in each tier, exactly as a walk to
the first missing block would find it, without walking every block of every tier. A
block's stamp is ``(epoch, i)``: the tier's eviction epoch and the block's position ``i``
in the record that last wrote it. A block stamped ``(current epoch, j)`` found at
position ``j`` of the looked-up chain has its ``j`` ancestors present: that record wrote
them together, after it in LRU order; a later record that writes the block writes its
ancestors after it again (or, starting mid-chain, restamps it with a smaller position),
so LRU pops cannot take an ancestor first, and anything else that removes blocks
(``evict``: an engine's ``BlockRemoved`` may drop a middle block) moves the epoch on. A
bisection over the stamp test (O(log blocks) dictionary reads) ends at a position the
stamps vouch for (the whole run after whole-chain records; short of it where a
mid-chain record restamped blocks: the test is then not monotone, but every position it
passes still vouches); from there a walk finds the first missing block (nothing to walk
in the common case; most of the run where records start mid-chain, as engine
``BlockStored`` events do, or after an ``evict``). This relies on what makes keys chain
(``router.prefix``): a key identifies the keys before it.

Parameters: ``capacity``, ``clock`` (kept for the constructors' common signature: order
is position here, not a timestamp), ``block_tokens`` (copied into each ``Residency``),
``step_s`` (see base.py; unused here for the same reason).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import islice, takewhile

from policies.base import DEFAULT_BLOCK_TOKENS, ReplicaId, Residency, Tier
from router.index.base import DEFAULT_STEP_S, BlockKey, IndexCapacity, check_record

# Stamp = epoch * _SPAN + position: one int compare per probe. Positions stay below any
# capacity a tier can have.
_SPAN = 1 << 48


class _LruBlocks:
    """Block key -> stamp (see the module docstring), least recently seen first."""

    __slots__ = ("base", "capacity", "entries")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.base = 0  # the current epoch times _SPAN
        self.entries: OrderedDict[BlockKey, int] = OrderedDict()

    def add(self, chain: Sequence[BlockKey]) -> None:
        chain = chain[: self.capacity]
        entries = self.entries
        base = self.base
        # Tail first: the head must end up most recent so eviction starts at the tail.
        for i in range(len(chain) - 1, -1, -1):
            key = chain[i]
            entries[key] = base + i
            entries.move_to_end(key)
        for _ in range(len(entries) - self.capacity):
            entries.popitem(last=False)

    def discard(self, keys: Sequence[BlockKey]) -> None:
        entries = self.entries
        size = len(entries)
        for key in keys:
            entries.pop(key, None)
        if len(entries) != size:  # a middle block may be gone: no stamp vouches any more
            self.base += _SPAN

    def leading(self, chain: Sequence[BlockKey]) -> int:
        """How many leading blocks of ``chain`` this tier holds."""
        get, base = self.entries.get, self.base
        lo = 0
        if chain and get(chain[0]) == base:
            lo, hi = 1, len(chain)  # stamps hold at lo - 1; find the first where they fail
            while lo < hi:
                mid = (lo + hi) >> 1
                if get(chain[mid]) == base + mid:
                    lo = mid + 1
                else:
                    hi = mid
        if lo == len(chain) or chain[lo] not in self.entries:
            return lo  # the common case: the stamps vouched for the whole run
        # takewhile over the C-level ``__contains__``: ~2x faster than a Python loop.
        return lo + len(list(takewhile(self.entries.__contains__, islice(chain, lo, None))))


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
        target.add(chain)

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
