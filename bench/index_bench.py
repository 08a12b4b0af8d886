"""Benchmark: prefix hashing, index lookups (memory and Redis), Redis memory per block.

Run: ``.venv/bin/python bench/index_bench.py`` (starts and stops its own redis-server on a
free loopback port). Prints a markdown report.

- hashing: ``chain_for_body`` of a chat body with a ~512 KB user message (a 128k-token
  prompt at ~4 bytes per token) in text mode, 1 KiB blocks -> 512 keys;
- lookup: p50/p99 of ``lookup`` for chains of 32, 128 and 512 blocks, every block present
  on each of 4 (``--replicas``) replicas' GPUs and in the pool (the worst case: every
  prefix scanned to its end), for MemoryIndex, RedisIndex and ResilientIndex over Redis
  (the production path);
- record: p50/p99 of a 512-block GPU record;
- Redis memory: INFO used_memory before/after indexing N blocks on one replica's GPU, and
  on every replica and the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers_redis import RedisServer  # noqa: E402

from policies.base import Tier  # noqa: E402
from router.index import IndexCapacity, MemoryIndex, PrefixIndex, RedisIndex, ResilientIndex  # noqa: E402
from router.prefix import bytes_chain, chain_for_body, root_key  # noqa: E402

REPLICAS: list[str] = []


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def bench_hashing(reps: int) -> list[float]:
    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyz     .,\n"
    text = "".join(rng.choice(alphabet) for _ in range(512 * 1024))
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text},
        ],
    }
    assert len(chain_for_body(body, "chat")) == 512
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        chain_for_body(body, "chat")
        samples.append(time.perf_counter() - t0)
    return samples


async def timed(call: Callable[[], Awaitable[object]], reps: int) -> list[float]:
    for _ in range(min(50, reps)):
        await call()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - t0)
    return samples


def chain(seed: int, blocks: int) -> list[int]:
    return bytes_chain(random.Random(seed).randbytes(blocks * 1024), root_key("m"))


async def bench_index(
    name: str, index: PrefixIndex, reps: int, only: int | None = None, record: bool = True
) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for blocks in (32, 128, 512) if only is None else (only,):
        c = chain(blocks, blocks)
        for replica in REPLICAS:
            await index.record(c, Tier.GPU, replica)
        await index.record(c, Tier.POOL)
        res = await index.lookup(c)
        assert res.pool == blocks and all(res.gpu_blocks(r) == blocks for r in REPLICAS)
        samples = await timed(lambda c=c: index.lookup(c), reps)  # type: ignore[misc]
        rows.append((name, f"lookup {blocks}", fmt_us(pct(samples, 0.5)), fmt_us(pct(samples, 0.99))))
    if only is not None and not record:
        return rows
    c512 = chain(512, 512)
    samples = await timed(lambda: index.record(c512, Tier.GPU, "r0"), reps // 4)
    rows.append((name, "record 512", fmt_us(pct(samples, 0.5)), fmt_us(pct(samples, 0.99))))
    return rows


async def redis_memory(url: str, blocks: int, tiers: list[str | None]) -> float:
    """Bytes of used_memory per block after indexing ``blocks`` blocks on each of ``tiers``
    (replica ids; None is the pool)."""
    admin = aioredis.Redis.from_url(url)
    await admin.flushall()
    before = int((await admin.info("memory"))["used_memory"])
    capacity = IndexCapacity(gpu_blocks=blocks, pool_blocks=blocks)
    index = RedisIndex(url, capacity, namespace=uuid.uuid4().hex)
    for seed in range(blocks // 512):
        for replica in tiers:
            tier = Tier.POOL if replica is None else Tier.GPU
            await index.record(chain(10_000 + seed, 512), tier, replica)
    after = int((await admin.info("memory"))["used_memory"])
    await index.close()
    await admin.aclose()
    return (after - before) / blocks


async def main_async(reps: int, memory_blocks: int, replicas: int) -> None:
    hashing = bench_hashing(reps)
    REPLICAS[:] = [f"r{i}" for i in range(replicas)]
    print("## Prefix hashing (chat body, 512 KB user message, 1 KiB blocks -> 512 keys)\n")
    print(
        f"p50 {fmt_us(pct(hashing, 0.5))}, p99 {fmt_us(pct(hashing, 0.99))}, "
        f"mean {fmt_us(statistics.fmean(hashing))} over {reps} runs\n"
    )

    server = RedisServer().start()
    try:
        capacity = IndexCapacity(gpu_blocks=1 << 20, pool_blocks=1 << 20)
        rows: list[tuple[str, ...]] = []
        memory = MemoryIndex(capacity)
        rows += await bench_index("memory", memory, reps)
        admin = aioredis.Redis.from_url(server.url)
        version = (await admin.info("server"))["redis_version"]
        print(f"redis-server {version} on loopback, {os.cpu_count()} CPUs\n")
        pings = await timed(admin.ping, reps)
        rows.append(
            ("redis", "PING (round-trip floor)", fmt_us(pct(pings, 0.5)), fmt_us(pct(pings, 0.99)))
        )
        shared = RedisIndex(server.url, capacity, namespace=uuid.uuid4().hex)
        for blocks in (32, 128, 512):
            await admin.config_resetstat()
            rows += await bench_index("redis", shared, reps, only=blocks, record=False)
            stats = await admin.info("commandstats")
            usec = float(stats["cmdstat_evalsha"]["usec_per_call"])
            rows.append(
                ("redis", f"lookup {blocks}: server time per call (mean)", f"{usec:,.0f} µs", "")
            )
        rows += (await bench_index("redis", shared, reps, only=32))[-1:]
        await admin.aclose()
        await shared.close()
        # 50 ms instead of the default 5 ms: this row measures the wrapper's overhead on the
        # Redis path, not how often a busy 2-core box trips the default (counted below).
        resilient = ResilientIndex(
            RedisIndex(server.url, capacity, namespace=uuid.uuid4().hex),
            MemoryIndex(capacity),
            lookup_timeout_s=0.05,
        )
        rows += await bench_index("resilient(redis)", resilient, reps)
        default = ResilientIndex(
            RedisIndex(server.url, capacity, namespace=uuid.uuid4().hex), MemoryIndex(capacity)
        )
        await bench_index("resilient(redis), 5 ms", default, reps)
        tripped = dict(default.errors)
        await default.close()
        errors = dict(resilient.errors)
        await resilient.close()
        print(f"## Index operations ({replicas} replicas + pool each holding the whole chain)\n")
        print("| index | operation | p50 | p99 |\n|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        print(
            f"\nresilient wrapper errors: 50 ms timeout {errors or 'none'}; "
            f"default 5 ms timeout, same run: {tripped or 'none'}\n"
        )
        one = await redis_memory(server.url, memory_blocks, ["r0"])
        shared_tiers: list[str | None] = [*REPLICAS, None]
        every = await redis_memory(server.url, memory_blocks, shared_tiers)
        print(
            f"## Redis memory (used_memory delta over {memory_blocks:,} blocks)\n\n"
            f"- on one replica's GPU: {one:.1f} bytes per block\n"
            f"- on each of {replicas} replicas and the pool: {every:.1f} bytes per block "
            f"({every / len(shared_tiers):.1f} per block and tier)"
        )
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--memory-blocks", type=int, default=102_400)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main_async(args.reps, args.memory_blocks, args.replicas))


if __name__ == "__main__":
    main()
