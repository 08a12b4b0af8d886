"""The emulator's Redis-held pool: the in-process pool's semantics, shared across processes."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import httpx
import pytest
import redis

from sim.emulator.redis_pool import RedisPool
from sim.replica.profiles import STUDY_27B, TINY

try:
    from servers import Server, replica
    from servers_redis import RedisServer
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica
    from tests.servers_redis import RedisServer

SMALL = dataclasses.replace(TINY, pool_bytes=6 * TINY.chunk_tokens * TINY.bytes_per_token)


def test_same_answers_as_the_in_process_pool_over_random_operations(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    """Stores, lookups at a time, evictions and counters agree step by step with
    SharedPool (the simulator's pool) on a pool of 6 chunks under pressure."""
    server = redis_server_factory()
    shared = SMALL.make_pool()
    held = RedisPool(redis.Redis.from_url(server.url), SMALL, time_scale=1.0)
    rng = random.Random(7)
    for step in range(400):
        chain = [rng.randrange(12) for _ in range(rng.randrange(0, 9))]
        at = rng.uniform(0, 50)
        if rng.random() < 0.5:
            ready = rng.uniform(0, 50)
            assert held.store(chain, ready) == shared.store(chain, ready), step
        assert held.contains_prefix(chain, at) == shared.contains_prefix(chain, at), step
        assert held.count_missing(chain) == shared.count_missing(chain), step
        loaded = rng.randrange(3)
        assert held.record_load(loaded) == shared.record_load(loaded)
    assert held.used_chunks == shared.used_chunks == SMALL.pool_bytes // shared.chunk_bytes
    stats = held.stats()
    assert (stats["stores"], stats["stored_chunks"], stats["evictions"]) == (
        shared.stores, shared.stored_chunks, shared.evictions)
    assert (stats["loads"], stats["loaded_chunks"]) == (shared.loads, shared.loaded_chunks)
    assert set(held.clear()) == set(shared.clear())
    assert held.contains_prefix(list(range(12))) == 0
    held.close()


def test_a_replica_with_another_profile_or_time_scale_is_refused(
        redis_server_factory: Callable[[], RedisServer]) -> None:
    url = redis_server_factory().url
    first = RedisPool.connect(url, TINY, 0.1)
    with pytest.raises(ValueError, match="capacity_chunks"):
        RedisPool.connect(url, STUDY_27B, 0.1)
    with pytest.raises(ValueError, match="time_scale"):
        RedisPool.connect(url, TINY, 0.5)
    second = RedisPool.connect(url, TINY, 0.1)
    assert second.epoch == first.epoch  # one model clock for the pool's replicas
    first.close()
    second.close()


def test_an_unreachable_pool_is_a_clear_start_up_error() -> None:
    with pytest.raises(ValueError, match=r"pool redis://127\.0\.0\.1:1/0"):
        RedisPool.connect("redis://127.0.0.1:1/0", TINY, 1.0)


def _chat(url: str, text: str) -> dict[str, int]:
    body = {"model": "emulated-27b", "max_tokens": 2,
            "messages": [{"role": "user", "content": text}]}
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=30.0)
    assert reply.status_code == 200, reply.text
    usage: dict[str, int] = reply.json()["usage"]
    return {"prompt": usage["prompt_tokens"],
            "cached": usage["prompt_tokens_details"]["cached_tokens"]}


def test_two_replica_processes_on_one_redis_pool_load_each_others_stores(
        redis_server_factory: Callable[[], RedisServer],
        start_servers: Callable[[Server], Server]) -> None:
    """A prompt prefilled on replica A is a pool hit on replica B, a separate process
    whose GPU never saw it; with separate (local) pools it is a miss."""
    url = redis_server_factory().url
    args = ("--profile", "study-27b", "--time-scale", "0.001")
    a = start_servers(replica(*args, "--pool", url, "--name", "a"))
    b = start_servers(replica(*args, "--pool", url, "--name", "b"))
    lonely = start_servers(replica(*args, "--pool", "local", "--name", "c"))
    text = "shared history " * 4000
    first = _chat(a.url, text)
    assert first["cached"] == 0
    moved = _chat(b.url, text)
    chunk = STUDY_27B.chunk_tokens
    assert moved["cached"] == (first["prompt"] // chunk) * chunk > 0
    assert _chat(lonely.url, text)["cached"] == 0
    stats = redis.Redis.from_url(url).hgetall("lmroute:pool:stats")
    assert int(stats[b"loads"]) == 1
