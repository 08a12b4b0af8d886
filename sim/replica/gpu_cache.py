"""Block LRU and one replica's GPU prefix cache.

Algorithm: an ``OrderedDict`` from block key (an int: our chained block hash) to the
virtual time the block becomes readable (``ready_at``). Order is recency, oldest first.

- ``match(chain, at)`` counts the leading keys of ``chain`` that are present and ready by
  ``at``. A prefix cache can only use a contiguous head of the chain: the first missing
  key ends the match (a block's KV depends on every token before it).
- ``insert(chain, ready_at)`` makes every key of the chain most recent, adds the missing
  ones and evicts from the old end until the size fits ``capacity``. A chain is touched
  tail first so its head ends up most recent: like vLLM, which frees a request's blocks
  in reverse order, eviction then takes the tails of old chains before their heads, and
  what stays is still a usable prefix. A chain longer than the capacity keeps its head.
- ``ready_at`` of a key already present becomes the earlier of the two times. Lookups at
  a time before ``ready_at`` do not see the block: a prefill that is still running has
  not written its KV yet, so a request routed elsewhere in the meantime must miss.

Eviction is decided when ``insert`` is called (the model commits a plan at admission),
not when the block would be written; pinning of blocks in use by running requests is not
modelled. Both are second-order next to the prefill/load costs this project studies.

Parameters: ``capacity`` (blocks, > 0).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

BlockKey = int


@dataclass(frozen=True, slots=True)
class CacheChange:
    """Keys an ``insert`` added (``stored``) and pushed out (``evicted``), in that order."""

    stored: tuple[BlockKey, ...] = ()
    evicted: tuple[BlockKey, ...] = ()


NO_CHANGE = CacheChange()


class BlockLRU:
    """LRU set of block keys with a ready time each; capacity counted in blocks."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[BlockKey, float] = OrderedDict()
        self.evictions = 0  # blocks evicted since construction (clear() does not count)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def match(self, chain: Sequence[BlockKey], at: float = math.inf) -> int:
        """Number of leading keys of ``chain`` present and ready by ``at``; no side effect."""
        n = 0
        for key in chain:
            ready = self._entries.get(key)
            if ready is None or ready > at:
                break
            n += 1
        return n

    def count_missing(self, chain: Sequence[BlockKey]) -> int:
        """How many keys of ``chain`` (as far as it fits) an ``insert`` would add."""
        return sum(1 for key in chain[: self.capacity] if key not in self._entries)

    def insert(self, chain: Sequence[BlockKey], ready_at: float = 0.0) -> CacheChange:
        """Make ``chain`` most recent (head last), add missing keys, evict the oldest."""
        stored: list[BlockKey] = []
        evicted: list[BlockKey] = []
        entries = self._entries
        # Tail first, so the head is the most recent (see the module docstring).
        for key in reversed(chain[: self.capacity]):
            old = entries.get(key)
            if old is None:
                while len(entries) >= self.capacity:
                    gone, _ = entries.popitem(last=False)
                    evicted.append(gone)
                entries[key] = ready_at
                stored.append(key)
            else:
                entries[key] = min(old, ready_at)
                entries.move_to_end(key)
        self.evictions += len(evicted)
        stored.reverse()  # report in chain order, the order engines publish BlockStored
        return CacheChange(tuple(stored), tuple(evicted))

    def clear(self) -> tuple[BlockKey, ...]:
        """Drop everything (an engine restart); returns the keys that were held."""
        keys = tuple(self._entries)
        self._entries.clear()
        return keys



class GpuPrefixCache:
    """One replica's GPU prefix cache: an LRU of ``capacity_blocks`` blocks."""

    def __init__(self, capacity_blocks: int) -> None:
        self._lru = BlockLRU(capacity_blocks)

    @property
    def capacity_blocks(self) -> int:
        return self._lru.capacity

    @property
    def used_blocks(self) -> int:
        return len(self._lru)

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    @property
    def usage(self) -> float:
        """Fraction of blocks held, 0..1: what ``vllm:kv_cache_usage_perc`` reports."""
        return len(self._lru) / self._lru.capacity

    def longest_prefix(self, chain: Sequence[BlockKey], at: float = math.inf) -> int:
        """Leading blocks of ``chain`` this GPU holds, ready by ``at``."""
        return self._lru.match(chain, at)

    def insert(self, chain: Sequence[BlockKey], ready_at: float = 0.0) -> CacheChange:
        return self._lru.insert(chain, ready_at)

    def clear(self) -> tuple[BlockKey, ...]:
        return self._lru.clear()
