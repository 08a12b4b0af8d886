"""The memory index's fast lookup (stamps + bisection) against Redis's block-by-block walk.

``MemoryIndex.lookup`` trusts a block's stamp to vouch for its ancestors and bisects; it
must still end each tier's run at the first missing block when records start mid-chain
(engine ``BlockStored`` events), a middle block is evicted (``BlockRemoved``), LRU pops
a head whose tail a later mid-chain record refreshed, or a replica is forgotten. The
Redis index walks every block (Lua), so the two must agree on any operation sequence.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence

from policies.base import Residency, Tier
from router.index import IndexCapacity, MemoryIndex, PrefixIndex, RedisIndex
from router.prefix import root_key, token_chain


class _Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _chain(seed: int, n: int) -> list[int]:
    ids = [random.Random(seed).randrange(50_000) for _ in range(n * 4)]
    return token_chain(ids, root_key("m"), block_tokens=4)


async def _ops(index: PrefixIndex, clock: _Clock, seed: int) -> list[Residency]:
    rng = random.Random(seed)
    replicas = ("r1", "r2", "r3")
    chains = [_chain(s, rng.randint(4, 40)) for s in range(5)]
    seen: list[Residency] = []
    for _ in range(300):
        c = rng.choice(chains)
        start = rng.choice([0, 0, 0, rng.randrange(len(c))])  # often whole, sometimes mid-chain
        part: Sequence[int] = c[start : rng.randint(start + 1, len(c))]
        tier, who = (Tier.POOL, None) if rng.random() < 0.3 else (Tier.GPU, rng.choice(replicas))
        op = rng.random()
        if op < 0.55:
            await index.record(part, tier, who)
        elif op < 0.85:
            await index.evict(rng.sample(c, rng.randint(1, 3)), tier, who)
        elif op < 0.9:
            await index.forget(rng.choice(replicas))
        looked = rng.choice(chains)
        seen.append(await index.lookup(looked))
        seen.append(await index.lookup(looked[rng.randrange(len(looked)) :]))
        clock.now += rng.choice([0.5, 1.0, 3.0])
    return seen


async def test_memory_lookup_walks_like_redis_through_holes(redis_url: str) -> None:
    capacity = IndexCapacity(gpu_blocks=30, pool_blocks=50, gpu_blocks_by_replica={"r3": 12})
    for seed in range(4):
        clock_m, clock_r = _Clock(), _Clock()
        memory = MemoryIndex(capacity, clock=clock_m)
        shared = RedisIndex(redis_url, capacity, namespace=uuid.uuid4().hex, clock=clock_r)
        try:
            expected = await _ops(memory, clock_m, seed)
            got = await _ops(shared, clock_r, seed)
        finally:
            await shared.close()
        assert got == expected, f"seed {seed}"
        # The sequence did exercise partial runs, not only all-or-nothing ones.
        assert any(0 < n < r.chain_blocks for r in expected for n in r.gpu.values())


async def test_a_hole_from_an_evict_ends_the_run_and_a_record_mends_it() -> None:
    index = MemoryIndex()
    a = _chain(1, 64)
    index.record_now(a, Tier.GPU, "r1")
    assert index.lookup_now(a).gpu_blocks("r1") == 64
    index.evict_now(a[40:41], Tier.GPU, "r1")
    assert index.lookup_now(a).gpu_blocks("r1") == 40
    index.evict_now(a[7:8], Tier.GPU, "r1")
    assert index.lookup_now(a).gpu_blocks("r1") == 7
    index.record_now(a[7:41], Tier.GPU, "r1")  # mid-chain, as an engine's BlockStored event
    assert index.lookup_now(a).gpu_blocks("r1") == 64
    index.record_now(a, Tier.GPU, "r1")
    assert index.lookup_now(a).gpu_blocks("r1") == 64
    assert index.lookup_now(a[:10]).gpu_blocks("r1") == 10


async def test_lru_pops_a_head_whose_tail_a_mid_chain_record_refreshed() -> None:
    index = MemoryIndex(IndexCapacity(gpu_blocks=16))
    a = _chain(1, 16)
    index.record_now(a, Tier.GPU, "r1")
    index.record_now(a[3:], Tier.GPU, "r1")  # a3..a15 now newer than a0..a2
    index.record_now(_chain(2, 1), Tier.GPU, "r1")  # pops the oldest: a2, mid-chain
    assert index.lookup_now(a).gpu_blocks("r1") == 2
    assert index.lookup_now(a[3:]).gpu_blocks("r1") == 13
