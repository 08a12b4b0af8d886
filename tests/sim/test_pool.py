"""The block LRU, the GPU prefix cache and the shared pool: bounds, prefixes, flags."""

from __future__ import annotations

import pytest

from sim.replica.gpu_cache import BlockLRU, GpuPrefixCache
from sim.replica.pool import SharedPool
from sim.replica.profiles import TINY


def test_lru_never_exceeds_capacity_and_counts_evictions() -> None:
    lru = BlockLRU(4)
    first = lru.insert([1, 2, 3])
    assert first.stored == (1, 2, 3) and first.evicted == ()
    second = lru.insert([10, 11, 12])
    assert len(lru) == 4
    assert len(second.evicted) == 2
    assert lru.evictions == 2
    assert lru.match([10, 11, 12]) == 3


def test_eviction_takes_the_tail_of_an_old_chain_before_its_head() -> None:
    lru = BlockLRU(4)
    lru.insert([1, 2, 3])
    change = lru.insert([9, 8])
    # The old chain keeps a usable prefix: its tail went first.
    assert change.evicted == (3,)
    assert lru.match([1, 2, 3]) == 2


def test_match_stops_at_the_first_missing_key() -> None:
    lru = BlockLRU(8)
    lru.insert([1, 2, 3])
    assert lru.match([1, 2, 3, 4]) == 3
    assert lru.match([1, 5, 3]) == 1
    assert lru.match([9, 1, 2]) == 0
    assert lru.match([]) == 0


def test_a_chain_longer_than_the_cache_keeps_its_head() -> None:
    lru = BlockLRU(3)
    change = lru.insert([1, 2, 3, 4, 5])
    assert change.stored == (1, 2, 3)
    assert lru.match([1, 2, 3, 4, 5]) == 3


def test_blocks_are_invisible_before_they_are_ready() -> None:
    lru = BlockLRU(8)
    lru.insert([1, 2], ready_at=5.0)
    assert lru.match([1, 2], at=4.9) == 0
    assert lru.match([1, 2], at=5.0) == 2
    lru.insert([1], ready_at=1.0)  # re-written earlier: the earlier time wins
    assert lru.match([1, 2], at=2.0) == 1


def test_insert_of_held_keys_stores_nothing_but_refreshes_recency() -> None:
    lru = BlockLRU(3)
    lru.insert([1, 2])
    lru.insert([7])
    assert lru.insert([1, 2]).stored == ()
    assert lru.insert([8]).evicted == (7,)


def test_gpu_cache_longest_prefix_usage_and_clear() -> None:
    gpu = GpuPrefixCache(capacity_blocks=4)
    gpu.insert([1, 2, 3])
    assert gpu.longest_prefix([1, 2, 3, 4]) == 3
    assert gpu.usage == pytest.approx(0.75)
    gpu.insert([5, 6])
    assert gpu.used_blocks == 4 and gpu.evictions == 1
    assert set(gpu.clear()) == {1, 2, 5, 6}
    assert gpu.longest_prefix([1]) == 0


def test_pool_capacity_is_bytes_over_chunk_bytes() -> None:
    pool = SharedPool(capacity_bytes=10 * 16 * 1024 + 5, chunk_tokens=16, bytes_per_token=1024)
    assert pool.chunk_bytes == 16 * 1024
    assert pool.capacity_chunks == 10
    pool.store(list(range(25)))
    assert pool.used_chunks == 10
    assert pool.used_bytes == 10 * pool.chunk_bytes
    with pytest.raises(ValueError):
        SharedPool(capacity_bytes=100, chunk_tokens=16, bytes_per_token=1024)


def test_pool_evicts_lru_and_counts() -> None:
    pool = SharedPool(4 * 16 * 1024, 16, 1024)
    pool.store([1, 2])
    pool.store([3, 4])
    assert pool.contains_prefix([1, 2]) == 2
    change = pool.store([5, 6])
    assert set(change.evicted) == {1, 2}
    assert pool.evictions == 2
    assert pool.contains_prefix([1, 2]) == 0
    assert pool.contains_prefix([3, 4]) == 2
    assert (pool.stores, pool.stored_chunks) == (3, 6)


def test_pool_off_holds_nothing_new_and_answers_zero() -> None:
    pool = TINY.make_pool()
    pool.store([1, 2, 3])
    pool.enabled = False
    assert pool.contains_prefix([1, 2, 3]) == 0
    assert pool.store([4]).stored == ()
    assert pool.count_missing([4]) == 0
    pool.enabled = True  # off is not a restart: what it held is still there
    assert pool.contains_prefix([1, 2, 3]) == 3
    assert pool.contains_prefix([4]) == 0
    pool.clear()
    assert pool.contains_prefix([1]) == 0


def test_store_skips_chunks_already_held() -> None:
    pool = TINY.make_pool()
    pool.store([1, 2])
    assert pool.count_missing([1, 2, 3, 4]) == 2
    assert pool.store([1, 2, 3, 4]).stored == (3, 4)


def test_corrupt_flag_marks_loads() -> None:
    pool = TINY.make_pool()
    assert pool.record_load(3) is False
    pool.corrupt = True
    assert pool.record_load(0) is False  # no load, nothing to corrupt
    assert pool.record_load(2) is True
    assert (pool.loads, pool.loaded_chunks, pool.corrupt_loads) == (2, 5, 1)
