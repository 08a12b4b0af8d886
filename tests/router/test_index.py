"""PrefixIndex semantics, one suite over the memory and the Redis index (real redis-server).

Also: memory/Redis equivalence on a random operation sequence, two routers sharing one
Redis, and the resilient wrapper riding out a Redis outage and a stall.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest
import redis.asyncio as aioredis

from policies.base import Residency, Tier
from router.index import IndexCapacity, MemoryIndex, PrefixIndex, RedisIndex, ResilientIndex
from router.prefix import root_key, token_chain

try:
    from servers_redis import RedisServer as RedisServerT
    from servers_redis import free_port
except ImportError:
    from tests.servers_redis import RedisServer as RedisServerT
    from tests.servers_redis import free_port

MakeIndex = Callable[..., Awaitable[PrefixIndex]]


class FakeClock:
    """Unix-like seconds (so Redis scores are realistic doubles), advanced by hand."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float = 1.0) -> None:
        self.now += seconds


def chain(seed: int, n: int) -> list[int]:
    ids = [random.Random(seed).randrange(50_000) for _ in range(n * 4)]
    return token_chain(ids, root_key("m"), block_tokens=4)


@pytest.fixture(params=["memory", "redis"])
async def make(request: pytest.FixtureRequest) -> AsyncIterator[MakeIndex]:
    opened: list[PrefixIndex] = []
    namespace = uuid.uuid4().hex

    async def factory(
        capacity: IndexCapacity | None = None, clock: Callable[[], float] | None = None
    ) -> PrefixIndex:
        clk = clock or FakeClock()
        index: PrefixIndex
        if request.param == "memory":
            index = MemoryIndex(capacity, clock=clk)
        else:
            url = request.getfixturevalue("redis_url")
            index = RedisIndex(url, capacity, namespace=namespace, clock=clk)
        opened.append(index)
        return index

    yield factory
    for index in opened:
        await index.close()


async def test_empty_index_knows_nothing(make: MakeIndex) -> None:
    index = await make()
    assert isinstance(index, PrefixIndex)
    res = await index.lookup(chain(1, 5))
    assert res == Residency(chain_blocks=5, block_tokens=256, gpu={}, pool=0)
    assert (await index.lookup([])).chain_blocks == 0


async def test_longest_prefix_per_replica_and_pool(make: MakeIndex) -> None:
    index = await make()
    a = chain(1, 10)
    await index.record(a[:6], Tier.GPU, "r1")
    await index.record(a[:3], Tier.GPU, "r2")
    await index.record(a[:8], Tier.POOL)
    res = await index.lookup(a)
    assert res.chain_blocks == 10
    assert dict(res.gpu) == {"r1": 6, "r2": 3}
    assert res.pool == 8
    # A chain that diverges after block 2 shares only those blocks.
    other = chain(2, 10)
    fork = [*a[:2], *other[2:]]
    res = await index.lookup(fork)
    assert dict(res.gpu) == {"r1": 2, "r2": 2}
    assert res.pool == 2
    assert (await index.lookup(other)).gpu == {}


async def test_a_missing_middle_block_ends_the_prefix(make: MakeIndex) -> None:
    clock = FakeClock()
    index = await make(IndexCapacity(gpu_blocks=4), clock)
    a = chain(1, 4)
    await index.record(a, Tier.GPU, "r1")  # recency: a0 newest ... a3 oldest
    clock.advance()
    await index.record(a[3:], Tier.GPU, "r1")  # a3 refreshed: a2 is now the oldest
    clock.advance()
    await index.record(chain(9, 1), Tier.GPU, "r1")  # evicts a2 only
    assert (await index.lookup(a)).gpu_blocks("r1") == 2
    assert (await index.lookup(a[3:])).gpu_blocks("r1") == 1


async def test_lru_evicts_oldest_chain_and_chain_tails_first(make: MakeIndex) -> None:
    clock = FakeClock()
    index = await make(IndexCapacity(gpu_blocks=8, pool_blocks=8), clock)
    a, b, c = chain(1, 4), chain(2, 4), chain(3, 4)
    for tier, replica in ((Tier.GPU, "r1"), (Tier.POOL, None)):
        for x in (a, b, c):
            await index.record(x, tier, replica)
            clock.advance()
    res_a, res_b, res_c = [await index.lookup(x) for x in (a, b, c)]
    assert (res_a.gpu_blocks("r1"), res_a.pool) == (0, 0)
    assert (res_b.gpu_blocks("r1"), res_b.pool) == (4, 4)
    assert (res_c.gpu_blocks("r1"), res_c.pool) == (4, 4)
    # One more block evicts the tail of the oldest chain, not its head.
    await index.record(chain(4, 1), Tier.GPU, "r1")
    assert (await index.lookup(b)).gpu_blocks("r1") == 3


async def test_never_believes_more_than_fits(make: MakeIndex) -> None:
    clock = FakeClock()
    index = await make(IndexCapacity(gpu_blocks=8, pool_blocks=5), clock)
    long = chain(1, 20)
    await index.record(long, Tier.GPU, "r1")
    await index.record(long, Tier.POOL)
    res = await index.lookup(long)
    assert (res.gpu_blocks("r1"), res.pool) == (8, 5)
    for seed in range(30):
        clock.advance()
        await index.record(chain(100 + seed, 3), Tier.GPU, "r1")
    held = 0
    for seed in range(30):
        held += (await index.lookup(chain(100 + seed, 3))).gpu_blocks("r1")
    held += (await index.lookup(long)).gpu_blocks("r1")
    assert held == 8


async def test_record_refreshes_recency_and_lookup_does_not(make: MakeIndex) -> None:
    clock = FakeClock()
    index = await make(IndexCapacity(gpu_blocks=8), clock)
    a, b, c = chain(1, 4), chain(2, 4), chain(3, 4)
    await index.record(a, Tier.GPU, "r1")
    clock.advance()
    await index.record(b, Tier.GPU, "r1")
    clock.advance()
    await index.lookup(a)  # looking does not keep a alive
    await index.record(c, Tier.GPU, "r1")
    assert (await index.lookup(a)).gpu_blocks("r1") == 0
    assert (await index.lookup(b)).gpu_blocks("r1") == 4
    clock.advance()
    await index.record(b, Tier.GPU, "r1")  # recording does
    clock.advance()
    await index.record(a, Tier.GPU, "r1")
    assert (await index.lookup(b)).gpu_blocks("r1") == 4
    assert (await index.lookup(c)).gpu_blocks("r1") == 0


async def test_per_replica_capacity(make: MakeIndex) -> None:
    index = await make(IndexCapacity(gpu_blocks=2, gpu_blocks_by_replica={"big": 6}))
    a = chain(1, 6)
    await index.record(a, Tier.GPU, "big")
    await index.record(a, Tier.GPU, "small")
    assert dict((await index.lookup(a)).gpu) == {"big": 6, "small": 2}


async def test_forget_drops_one_replica(make: MakeIndex) -> None:
    index = await make()
    a = chain(1, 4)
    await index.record(a, Tier.GPU, "r1")
    await index.record(a, Tier.GPU, "r2")
    await index.record(a, Tier.POOL)
    await index.forget("r1")
    await index.forget("never-seen")
    res = await index.lookup(a)
    assert dict(res.gpu) == {"r2": 4}
    assert res.pool == 4


async def test_invalid_records_raise(make: MakeIndex) -> None:
    index = await make()
    with pytest.raises(ValueError):
        await index.record([1], Tier.GPU)
    with pytest.raises(ValueError):
        await index.record([1], Tier.POOL, "r1")
    with pytest.raises(ValueError):
        await index.record([1], Tier.MISS, "r1")


async def test_long_chains(make: MakeIndex) -> None:
    # Past the Lua batch sizes and unpack()'s ~8000-value stack limit.
    index = await make(IndexCapacity(gpu_blocks=20_000, pool_blocks=20_000))
    long = chain(1, 9000)
    await index.record(long[:5000], Tier.GPU, "r1")
    await index.record(long, Tier.POOL)
    res = await index.lookup(long)
    assert (res.gpu_blocks("r1"), res.pool, res.chain_blocks) == (5000, 9000, 9000)


async def test_many_replicas_and_reused_slots(make: MakeIndex) -> None:
    # More than 8 tiers (the Redis holder bitmap spans bytes); forgotten replicas' places
    # are reused without passing on their beliefs.
    index = await make()
    a = chain(1, 12)
    for i in range(12):
        await index.record(a[: i + 1], Tier.GPU, f"r{i}")
    await index.record(a[:5], Tier.POOL)
    res = await index.lookup(a)
    assert dict(res.gpu) == {f"r{i}": i + 1 for i in range(12)}
    assert res.pool == 5
    await index.forget("r3")
    await index.forget("r10")
    await index.record(a[:2], Tier.GPU, "new")
    await index.record(chain(2, 3), Tier.GPU, "other")
    await index.record(a[:1], Tier.GPU, "r3")
    expected = {f"r{i}": i + 1 for i in range(12) if i not in (3, 10)}
    assert dict((await index.lookup(a)).gpu) == {**expected, "new": 2, "r3": 1}
    assert dict((await index.lookup(chain(2, 3))).gpu) == {"other": 3}


async def test_evict_drops_given_blocks_whatever_their_recency(make: MakeIndex) -> None:
    index = await make(IndexCapacity(gpu_blocks=4))
    a, b = chain(1, 4), chain(2, 4)
    for replica in ("r1", "r2"):
        await index.record(a, Tier.GPU, replica)
    await index.record(a, Tier.POOL)
    await index.evict([a[2], b[0]], Tier.GPU, "r1")  # b[0] is not held: ignored
    await index.evict(a[1:2], Tier.POOL)
    await index.evict(a, Tier.GPU, "never-seen")
    await index.evict([], Tier.POOL)
    res = await index.lookup(a)
    assert (dict(res.gpu), res.pool) == ({"r1": 2, "r2": 4}, 1)
    await index.record(b[:1], Tier.GPU, "r1")  # the freed place is used: nothing evicted
    assert (await index.lookup(a)).gpu_blocks("r1") == 2
    assert (await index.lookup(a[3:])).gpu_blocks("r1") == 1
    with pytest.raises(ValueError):
        await index.evict(a, Tier.GPU)
    with pytest.raises(ValueError):
        await index.evict(a, Tier.POOL, "r1")


async def test_redis_keeps_no_stale_bitmaps(redis_url: str) -> None:
    namespace = uuid.uuid4().hex
    index = RedisIndex(redis_url, IndexCapacity(gpu_blocks=4, pool_blocks=4), namespace=namespace)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        a, b = chain(1, 4), chain(2, 4)
        for replica in ("r1", "r2"):
            await index.record(a, Tier.GPU, replica)
        await index.record(a, Tier.POOL)
        await index.forget("r1")
        await index.evict(a[:2], Tier.GPU, "r2")
        await index.forget("r2")
        await index.record(b, Tier.POOL)  # evicts a from the pool: a is held nowhere
        fields = set(await admin.hkeys(f"{{{namespace}}}:blocks")) - {b""}
        assert fields == {key.to_bytes(8, "big") for key in b}
        assert await admin.hlen(f"{{{namespace}}}:slots") == 0
    finally:
        await admin.aclose()
        await index.close()


async def run_ops(
    index: PrefixIndex, clock: FakeClock, seed: int, replicas: Sequence[str] = ("r1", "r2", "r3")
) -> list[Residency]:
    rng = random.Random(seed)
    chains = [chain(s, rng.randint(1, 12)) for s in range(6)]
    seen: list[Residency] = []
    for _ in range(150):
        op = rng.random()
        c: Sequence[int] = rng.choice(chains)
        c = c[: rng.randint(1, len(c))]
        if op < 0.45:
            await index.record(c, Tier.GPU, rng.choice(replicas))
        elif op < 0.65:
            await index.record(c, Tier.POOL)
        elif op < 0.7:
            await index.forget(rng.choice(replicas))
        seen.append(await index.lookup(rng.choice(chains)))
        clock.advance(rng.choice([0.5, 1.0, 3.0]))
    return seen


async def test_memory_and_redis_agree(redis_url: str) -> None:
    capacity = IndexCapacity(gpu_blocks=10, pool_blocks=16, gpu_blocks_by_replica={"r3": 4})
    clock_m, clock_r = FakeClock(), FakeClock()
    memory = MemoryIndex(capacity, clock=clock_m)
    shared = RedisIndex(redis_url, capacity, namespace=uuid.uuid4().hex, clock=clock_r)
    try:
        for seed in range(3):
            expected = await run_ops(memory, clock_m, seed)
            assert await run_ops(shared, clock_r, seed) == expected
    finally:
        await shared.close()


async def test_memory_and_redis_agree_with_many_replicas(redis_url: str) -> None:
    capacity = IndexCapacity(gpu_blocks=10, pool_blocks=16, gpu_blocks_by_replica={"r3": 4})
    replicas = [f"r{i}" for i in range(20)]
    clock_m, clock_r = FakeClock(), FakeClock()
    memory = MemoryIndex(capacity, clock=clock_m)
    shared = RedisIndex(redis_url, capacity, namespace=uuid.uuid4().hex, clock=clock_r)
    try:
        for seed in range(3):
            expected = await run_ops(memory, clock_m, seed, replicas)
            assert await run_ops(shared, clock_r, seed, replicas) == expected
    finally:
        await shared.close()


async def test_two_routers_share_one_redis(redis_url: str) -> None:
    namespace = uuid.uuid4().hex
    one = RedisIndex(redis_url, namespace=namespace)
    two = RedisIndex(redis_url, namespace=namespace)
    elsewhere = RedisIndex(redis_url, namespace=uuid.uuid4().hex)
    try:
        a = chain(1, 5)
        await one.record(a, Tier.GPU, "r1")
        await two.record(a[:3], Tier.POOL)
        for index in (one, two):
            res = await index.lookup(a)
            assert (dict(res.gpu), res.pool) == ({"r1": 5}, 3)
        assert (await elsewhere.lookup(a)) == Residency(chain_blocks=5)
        await two.forget("r1")
        assert (await one.lookup(a)).gpu == {}
    finally:
        for index in (one, two, elsewhere):
            await index.close()


class Resilient:
    """A ResilientIndex over a RedisIndex, with its clocks and error log."""

    def __init__(self, url: str, namespace: str, lookup_timeout_s: float = 0.5) -> None:
        self.clock = FakeClock(0.0)
        self.kinds: list[str] = []
        self.index = ResilientIndex(
            RedisIndex(url, namespace=namespace, socket_timeout_s=0.5),
            MemoryIndex(),
            clock=self.clock,
            on_error=self.kinds.append,
            lookup_timeout_s=lookup_timeout_s,
            write_timeout_s=0.5,
            backoff_initial_s=1.0,
            backoff_max_s=4.0,
        )


async def test_resilient_rides_out_a_redis_outage(
    redis_server_factory: Callable[[], RedisServerT],
) -> None:
    server = redis_server_factory()
    namespace = uuid.uuid4().hex
    r = Resilient(server.url, namespace)
    other_router = RedisIndex(server.url, namespace=namespace)
    a, b = chain(1, 4), chain(2, 4)
    try:
        await r.index.record(a, Tier.GPU, "r1")
        await other_router.record(b, Tier.POOL)
        assert (await r.index.lookup(b)).pool == 4  # answered by Redis
        assert not r.index.degraded

        server.stop()
        res = await r.index.lookup(a)  # Redis gone: local memory answers
        assert dict(res.gpu) == {"r1": 4}
        assert (await r.index.lookup(b)).pool == 0  # the other router's record was shared only
        await r.index.record(a[:2], Tier.POOL)
        assert (await r.index.lookup(a)).pool == 2
        assert r.kinds == ["lookup_error"]  # then the circuit is open: Redis is not asked
        assert r.index.degraded

        r.clock.advance(1.5)  # backoff (1 s) over: one probe fails, backoff doubles to 2 s
        await r.index.lookup(a)
        assert r.kinds == ["lookup_error", "lookup_error"]
        r.clock.advance(1.5)
        await r.index.lookup(a)
        assert len(r.kinds) == 2

        server.start()  # same port; the restarted Redis is empty
        await other_router.record(b, Tier.POOL)
        r.clock.advance(1.0)
        assert (await r.index.lookup(b)).pool == 4  # reconnected
        assert not r.index.degraded
        await r.index.record(a, Tier.GPU, "r2")
        assert dict((await other_router.lookup(a)).gpu) == {"r2": 4}
        assert r.index.errors == {"lookup_error": 2}
    finally:
        await r.index.close()
        await other_router.close()


async def test_resilient_falls_back_when_redis_stalls(redis_url: str) -> None:
    namespace = uuid.uuid4().hex
    r = Resilient(redis_url, namespace, lookup_timeout_s=0.05)
    admin = aioredis.Redis.from_url(redis_url)
    a = chain(1, 3)
    try:
        await r.index.record(a, Tier.GPU, "r1")
        await admin.execute_command("CLIENT", "PAUSE", "400", "ALL")
        res = await r.index.lookup(a)  # Redis is paused: times out, memory answers
        assert dict(res.gpu) == {"r1": 3}
        assert r.kinds == ["lookup_timeout"]
        await admin.execute_command("CLIENT", "UNPAUSE")
        r.clock.advance(2.0)
        assert dict((await r.index.lookup(a)).gpu) == {"r1": 3}
        assert not r.index.degraded
    finally:
        await admin.aclose()
        await r.index.close()


async def test_resilient_without_any_redis_never_raises() -> None:
    kinds: list[str] = []
    index = ResilientIndex(
        RedisIndex(f"redis://127.0.0.1:{free_port()}/0"),
        MemoryIndex(),
        clock=FakeClock(0.0),
        on_error=kinds.append,
    )
    a = chain(1, 2)
    await index.record(a, Tier.GPU, "r1")
    await index.forget("r2")
    assert dict((await index.lookup(a)).gpu) == {"r1": 2}
    assert kinds == ["record_error", "forget_error"]
    with pytest.raises(ValueError):  # caller mistakes still raise
        await index.record(a, Tier.GPU)
    await index.close()
