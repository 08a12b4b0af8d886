"""The shared LMCache KV pool: one LRU of chunks, shared by every replica model.

Algorithm: a ``BlockLRU`` (see ``sim.replica.gpu_cache``) over chunk keys, the same chained block
hashes the replicas' GPU caches use, with the capacity given in bytes and turned into
chunks as ``capacity_bytes // chunk_bytes`` where
``chunk_bytes = chunk_tokens * bytes_per_token``. LMCache stores whole chunks only and
skips chunks it already holds; a replica loads the leading run of chunks the pool holds.

Parameters:
- ``capacity_bytes``: pool size (the study: 256 GiB of host memory).
- ``chunk_tokens``: tokens per chunk (the study: 1,568).
- ``bytes_per_token``: KV bytes one token takes (the study's FP8 KV: 32 KiB).
- ``enabled``: the study's ON/OFF switch. Off, the pool holds nothing new and answers
  every lookup with 0; turning it off does not empty it (``clear()`` does: a restart).
- ``corrupt``: fault flag for the study's bug class (a raw-pointer copy that ignored the
  current CUDA stream corrupted loaded bytes): while set, every load from the pool is
  reported as corrupt, and the live replica makes such replies differ.

Counters (never reset by ``clear``): ``stores``/``stored_chunks`` (store calls that added
chunks, chunks added), ``loads``/``loaded_chunks`` (loads recorded by replicas),
``evictions`` (chunks evicted), ``corrupt_loads``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from sim.replica.gpu_cache import NO_CHANGE, BlockKey, BlockLRU, CacheChange


class Pool(Protocol):
    """What a replica model asks of a pool: ``SharedPool`` (in-process) or the emulator's
    ``RedisPool`` (shared by replica processes, sim.emulator.redis_pool)."""

    chunk_tokens: int
    bytes_per_token: int
    enabled: bool

    def contains_prefix(self, chain: Sequence[BlockKey], at: float = math.inf) -> int: ...

    def count_missing(self, chain: Sequence[BlockKey]) -> int: ...

    def store(self, chain: Sequence[BlockKey], ready_at: float = 0.0) -> CacheChange: ...

    def record_load(self, chunks: int) -> bool: ...


class SharedPool:
    """Chunk LRU with a byte capacity, shared by all replicas of one deployment."""

    def __init__(
        self,
        capacity_bytes: int,
        chunk_tokens: int,
        bytes_per_token: int,
        *,
        enabled: bool = True,
        corrupt: bool = False,
    ) -> None:
        if chunk_tokens <= 0 or bytes_per_token <= 0:
            raise ValueError("chunk_tokens and bytes_per_token must be positive")
        self.chunk_tokens = chunk_tokens
        self.bytes_per_token = bytes_per_token
        self.chunk_bytes = chunk_tokens * bytes_per_token
        if capacity_bytes < self.chunk_bytes:
            raise ValueError(f"capacity {capacity_bytes} B holds no {self.chunk_bytes} B chunk")
        self.capacity_bytes = capacity_bytes
        self._lru = BlockLRU(capacity_bytes // self.chunk_bytes)
        self.enabled = enabled
        self.corrupt = corrupt
        self.stores = 0
        self.stored_chunks = 0
        self.loads = 0
        self.loaded_chunks = 0
        self.corrupt_loads = 0
        self._tainted: set[BlockKey] = set()

    @property
    def capacity_chunks(self) -> int:
        return self._lru.capacity

    @property
    def used_chunks(self) -> int:
        return len(self._lru)

    @property
    def used_bytes(self) -> int:
        return len(self._lru) * self.chunk_bytes

    @property
    def evictions(self) -> int:
        return self._lru.evictions

    def contains_prefix(self, chain: Sequence[BlockKey], at: float = math.inf) -> int:
        """Leading chunks of ``chain`` held and ready by ``at``; 0 while the pool is off."""
        return self._lru.match(chain, at) if self.enabled else 0

    def count_missing(self, chain: Sequence[BlockKey]) -> int:
        """Chunks a ``store(chain)`` would write now (0 while off): what a store costs."""
        return self._lru.count_missing(chain) if self.enabled else 0

    def store(self, chain: Sequence[BlockKey], ready_at: float = 0.0) -> CacheChange:
        """Write the chain's chunks through (missing ones added, all made recent)."""
        if not self.enabled:
            return NO_CHANGE
        change = self._lru.insert(chain, ready_at)
        if change.stored:
            self.stores += 1
            self.stored_chunks += len(change.stored)
        return change

    def record_load(self, chunks: int) -> bool:
        """Count a replica's load of ``chunks`` chunks; returns whether it was corrupt."""
        if chunks <= 0:
            return False
        self.loads += 1
        self.loaded_chunks += chunks
        if self.corrupt:
            self.corrupt_loads += 1
        return self.corrupt

    def taint(self, keys: Sequence[BlockKey]) -> None:
        """Mark chunks as written wrong (the emulator's ``replica`` corrupt-pool mode)."""
        self._tainted.update(keys)

    def tainted(self, keys: Sequence[BlockKey]) -> bool:
        """Whether any of ``keys`` was written wrong."""
        return any(k in self._tainted for k in keys)

    def clear(self) -> tuple[BlockKey, ...]:
        """Empty the pool (a restart); returns the keys that were held."""
        self._tainted.clear()
        return self._lru.clear()
