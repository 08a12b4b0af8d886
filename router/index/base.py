"""The PrefixIndex protocol: where the router believes each prefix block lives.

Per block key the index keeps which replicas' GPU prefix caches are believed to hold it
(with the time it was last seen) and whether the shared pool holds it. Beliefs are bounded
by capacity: each replica's GPU cache and the pool hold at most a configured number of
blocks (``IndexCapacity``), and older entries age out LRU, so the index never believes
more than fits and its memory stays bounded (production-stack's unbounded prefix trie
OOMed its router, their issue #687).

Contract, identical for every implementation (one test suite runs over all of them):

- ``lookup(chain)`` returns a ``Residency``: per replica the number of leading blocks of
  ``chain`` on its GPU (replicas with none are left out) and the number of leading blocks
  in the pool. A block evicted in the middle ends the prefix there. One round trip to any
  backing store. Lookup does not refresh recency (a router looking at a prefix says
  nothing about the engine keeping it).
- ``record(chain, tier, replica)`` marks the chain's blocks as present in the GPU cache of
  ``replica`` (``Tier.GPU``; ``replica`` required) or in the pool (``Tier.POOL``; no
  replica), refreshing their recency. Within one record the head of the chain is the most
  recent and each deeper block ``step_s`` older, so LRU evicts a chain from its tail and
  keeps prefixes whole, as vLLM does by freeing a request's blocks in reverse order. Only
  the first ``capacity`` blocks of a longer chain can fit, so only those are kept.
- ``evict(keys, tier, replica)`` drops the given blocks from the GPU cache of ``replica``
  (``Tier.GPU``) or from the pool (``Tier.POOL``), whatever their recency; keys the tier
  does not hold are ignored. The engine's own ``BlockRemoved`` events come in here
  (router/events.py): with them the index follows the engine instead of guessing by LRU.
- ``forget(replica)`` drops everything believed about a replica's GPU (restart, removal).
- ``warm()`` connects (and loads scripts) before the first request; ``close()``
  releases connections.

Implementations raise ``IndexUnavailable`` (and only that) when their backing store fails;
``ResilientIndex`` turns that into a local fallback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from policies.base import ReplicaId, Residency, Tier

BlockKey = int

# Recency offset between consecutive blocks of one record: 1 µs is above the spacing of
# doubles near today's Unix time (~2.4e-7 s), so scores stay distinct in Redis.
DEFAULT_STEP_S = 1e-6


class IndexUnavailable(Exception):
    """The index's backing store (Redis) failed or timed out."""


@dataclass(frozen=True, slots=True)
class IndexCapacity:
    """How many blocks each tier holds; the settings layer derives these from bytes.

    ``gpu_blocks`` applies to every replica unless ``gpu_blocks_by_replica`` names it.
    """

    gpu_blocks: int = 65_536
    pool_blocks: int = 1_048_576
    gpu_blocks_by_replica: Mapping[ReplicaId, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = [self.gpu_blocks, self.pool_blocks, *self.gpu_blocks_by_replica.values()]
        if min(sizes) < 1:
            raise ValueError("index capacities must be at least one block")

    def gpu_for(self, replica: ReplicaId) -> int:
        return self.gpu_blocks_by_replica.get(replica, self.gpu_blocks)


@runtime_checkable
class PrefixIndex(Protocol):
    """Where prefix blocks live. See the module docstring for the contract."""

    async def lookup(self, chain: Sequence[BlockKey]) -> Residency: ...

    async def record(
        self, chain: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None: ...

    async def evict(
        self, keys: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None: ...

    async def forget(self, replica: ReplicaId) -> None: ...

    async def warm(self) -> None: ...

    async def close(self) -> None: ...


def check_record(tier: Tier, replica: ReplicaId | None) -> None:
    """Reject calls the contract does not define (a programming error, not a store one).

    The same rules hold for ``record`` and ``evict``.
    """
    if tier is Tier.GPU and replica is None:
        raise ValueError("recording the GPU tier needs the replica")
    if tier is Tier.POOL and replica is not None:
        raise ValueError("the pool is shared: record it without a replica")
    if tier is Tier.MISS:
        raise ValueError("nothing to record for Tier.MISS")
