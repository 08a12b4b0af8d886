"""KV events, the remaining cases: replay layouts, data-parallel ranks, replica-local CPU
offload, pool capacity.

Publishers are real pyzmq PUB/ROUTER sockets on 127.0.0.1 speaking vLLM's wire format;
the consumer is the router's own ``EngineEvents`` over a real ``MemoryIndex``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from servers import replica
from servers import router as router_server
from servers_redis import free_port
from test_events import IDS, ROOT, Publisher, engine_hashes, make_tokenizer, send_until_precise, stores

from policies.base import Tier
from router.events import EngineEvents, KvIngest, parse_sources
from router.index import MemoryIndex, PrefixIndex, RedisIndex
from router.locator import capacity_from_bytes
from router.prefix import root_key, token_chain
from router.tokenizer import ChatTokenizer
from sim.emulator.kv_events import block_removed, block_stored

R = "http://r1"
CHAIN = token_chain(IDS, ROOT, 256)


class Rank(Publisher):
    """One engine's publisher (one DP rank): PUB, and a ROUTER answering replays in the
    layout of current vLLM (with the topic frame) or of older versions (without)."""

    def __init__(self, *, topic_in_replay: bool = True) -> None:
        self._topic_in_replay = topic_in_replay
        super().__init__(replay=True)

    def _serve_replay(self) -> None:
        sock = self.ctx.socket(zmq.ROUTER)
        assert self.replay_endpoint is not None
        sock.bind(self.replay_endpoint)
        topic = [b"kv-events"] if self._topic_in_replay else []
        while not self._stop.is_set():
            if not sock.poll(50):
                continue
            client, _, start = sock.recv_multipart()
            for seq, buf in self.sent:
                if seq >= int.from_bytes(start, "big"):
                    sock.send_multipart([client, b"", *topic, seq.to_bytes(8, "big"), buf])
            end = (-1).to_bytes(8, "big", signed=True)
            sock.send_multipart([client, b"", *([b""] if topic else []), end, b""])
        sock.close(0)


async def _model(replica: str) -> str:
    return "m"


async def joined(events: EngineEvents, ranks: Sequence[Rank]) -> None:
    """Wait until every rank's SUB is through (a SUB misses what precedes its join)."""
    empty = msgpack.packb([0.0, [], 0])
    async with asyncio.timeout(5):
        for state, rank in zip(events.ranks[R], ranks, strict=True):
            while state.batches == 0:
                rank.pub.send_multipart([b"kv-events", (0).to_bytes(8, "big"), empty])
                await asyncio.sleep(0.05)
            rank.sent.append((0, empty))


async def settle(events: EngineEvents, rank: int, seq: int) -> None:
    state = events.ranks[R][rank]
    async with asyncio.timeout(5):
        while state.last_seq != seq:
            await asyncio.sleep(0.01)


def consumer(ranks: Sequence[Rank], index: MemoryIndex, **kw: Any) -> EngineEvents:
    endpoints = "+".join(r.endpoint for r in ranks)
    replays = "+".join(str(r.replay_endpoint) for r in ranks)
    ingest = KvIngest(index, _model, block_tokens=256, max_blocks=10_000, **kw)
    return EngineEvents(parse_sources([R], [endpoints], [replays]), ingest)


@pytest.mark.parametrize("topic_in_replay", [True, False])
async def test_replay_with_and_without_the_topic_frame(topic_in_replay: bool) -> None:
    rank, index = Rank(topic_in_replay=topic_in_replay), MemoryIndex()
    events = consumer([rank], index)
    events.start()
    try:
        await joined(events, [rank])
        first, second = stores(IDS, 32, [16])
        rank.send(1, [first])
        rank.send(2, [second], wire=False)  # lost on the PUB socket, kept for replay
        rank.send(3, [block_removed(second["block_hashes"][-1:], "GPU")])
        await settle(events, 0, 3)
        state = events.ranks[R][0]
        assert (state.gaps, state.replayed) == (0, 1)
        assert index.lookup_now(CHAIN).gpu_blocks(R) == 3
    finally:
        await events.stop()
        rank.close()


def test_data_parallel_endpoints_parse_per_rank() -> None:
    a, b = "http://a:1", "http://b:2"
    got = parse_sources([a, b], ["tcp://h:5557..5559", "tcp://g:1+bind:tcp://127.0.0.1:2"],
                        [f"{a}=tcp://h:6557..6559"])
    assert [(s.replica, s.rank, s.endpoint, s.bind, s.replay) for s in got] == [
        (a, 0, "tcp://h:5557", False, "tcp://h:6557"), (a, 1, "tcp://h:5558", False, "tcp://h:6558"),
        (a, 2, "tcp://h:5559", False, "tcp://h:6559"), (b, 0, "tcp://g:1", False, None),
        (b, 1, "tcp://127.0.0.1:2", True, None)]
    for events, replay in ((["tcp://h:9..1"], []), (["tcp://h:1..2"], ["tcp://h:3"]),
                           (["tcp://h:1+"], []), (["tcp://h:1..999"], [])):
        with pytest.raises(ValueError):
            parse_sources([a], events, replay)


async def test_data_parallel_ranks_keep_their_own_sequences_and_blocks() -> None:
    ranks, index = [Rank(), Rank()], MemoryIndex()
    events = consumer(ranks, index)
    events.start()
    try:
        await joined(events, ranks)
        # The same prompt on both ranks: the same engine hashes, in two separate caches.
        for rank in ranks:
            rank.send(1, stores(IDS, 32, []))
        await settle(events, 0, 1)
        await settle(events, 1, 1)
        assert index.lookup_now(CHAIN).gpu_blocks(R) == 4
        last = stores(IDS, 32, [])[0]["block_hashes"][-1:]
        ranks[1].send(2, [block_removed(last, "GPU")])
        await settle(events, 1, 2)
        assert index.lookup_now(CHAIN).gpu_blocks(R) == 4  # rank 0 still holds it
        ranks[0].send(0, [])  # rank 0 restarted: only its blocks go
        await settle(events, 0, 0)
        assert index.lookup_now(CHAIN).gpu_blocks(R) == 3
        assert [s.restarts for s in events.ranks[R]] == [1, 0]
        per_rank = events.status(R)["ranks"]
        assert isinstance(per_rank, list) and [r["rank"] for r in per_rank] == [0, 1]
    finally:
        await events.stop()
        for rank in ranks:
            rank.close()


async def test_replica_local_cpu_offload_is_that_replicas_not_the_pool() -> None:
    """vLLM's own CPU offload (medium "CPU") counts as the replica's cached prefix."""
    rank, index = Rank(), MemoryIndex()
    events = consumer([rank], index)
    events.start()
    try:
        await joined(events, [rank])
        [gpu], [cpu] = stores(IDS, 32, []), stores(IDS, 32, [], medium="CPU")
        rank.send(1, [gpu, cpu])
        await settle(events, 0, 1)
        found = index.lookup_now(CHAIN)
        assert (found.gpu_blocks(R), found.pool) == (4, 0)
        rank.send(2, [block_removed(gpu["block_hashes"], "GPU")])  # offloaded: still local
        await settle(events, 0, 2)
        assert index.lookup_now(CHAIN).gpu_blocks(R) == 4
        rank.send(3, [block_removed(cpu["block_hashes"][8:9], "CPU")])
        await settle(events, 0, 3)
        assert index.lookup_now(CHAIN).gpu_blocks(R) == 1
    finally:
        await events.stop()
        rank.close()


@pytest.mark.parametrize(("medium", "locality", "local_media", "where"), [
    ("cpu", None, ("CPU",), "pool"),  # LMCache's store: the shared pool by default
    ("cpu", "local", ("CPU",), "gpu"),  # ... unless it says it is local
    ("CPU", "shared", ("CPU",), "pool"),
    ("cpu", None, ("CPU", "cpu"), "gpu"),  # --kv-events-local-media CPU,cpu
])
async def test_medium_and_locality_decide_the_tier(medium: str, locality: str | None,
                                                   local_media: tuple[str, ...], where: str) -> None:
    index = MemoryIndex()
    ingest = KvIngest(index, _model, block_tokens=256, max_blocks=1000, local_media=local_media)
    events = EngineEvents(parse_sources([R], ["tcp://127.0.0.1:1"]), ingest)
    [store] = stores(IDS, 32, [], medium=medium)
    if locality is not None:
        store["locality"] = locality
    await ingest.apply(events.states[R], msgpack.packb([0.0, [store], 0]))
    found = index.lookup_now(CHAIN)
    assert (found.gpu_blocks(R), found.pool) == ((4, 0) if where == "gpu" else (0, 4))


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_pool_stores_age_out_by_capacity_and_recency(
        kind: str, request: pytest.FixtureRequest) -> None:
    """LMCache publishes stores only: the pool's evictions are the index's LRU at the
    capacity --pool-bytes / (--block-tokens x --kv-bytes-per-token) gives."""
    capacity = capacity_from_bytes(2**30, pool_bytes=8 * 256 * 1024, block_tokens=256,
                                   kv_bytes_per_token=1024)
    assert capacity.pool_blocks == 8
    clock = iter(range(1000, 2000))
    index: PrefixIndex = MemoryIndex(capacity, clock=lambda: float(next(clock)))
    if kind == "redis":
        index = RedisIndex(request.getfixturevalue("redis_url"), capacity,
                           namespace=uuid.uuid4().hex, clock=lambda: float(next(clock)))
    ingest = KvIngest(index, _model, block_tokens=256, max_blocks=1000)
    state = EngineEvents(parse_sources([R], ["tcp://127.0.0.1:1"]), ingest).states[R]
    docs = [[d * 10_000 + t for t in range(1024)] for d in range(1, 5)]
    chains = [token_chain(ids, ROOT, 256) for ids in docs]

    async def lmcache_store(doc: int) -> None:
        batch = stores(docs[doc], 256, [], medium="cpu")
        await ingest.apply(state, msgpack.packb([0.0, batch, 0]))

    async def pooled() -> list[int]:
        return [(await index.lookup(chain)).pool for chain in chains]

    try:
        for doc in range(3):
            await lmcache_store(doc)
        assert await pooled() == [0, 4, 4, 0]  # 12 blocks stored, 8 fit: the oldest went
        await index.record(chains[1], Tier.POOL)  # a served reply refreshes it (write-through)
        await lmcache_store(3)
        assert await pooled() == [0, 4, 0, 4]
    finally:
        await index.close()


def test_emulated_replica_with_cpu_offload_indexes_it_as_its_own(start_servers: Any) -> None:
    """``lmroute replica --kv-events-pool-medium CPU`` (vLLM's own CPU offload): its
    offloaded chunks count for that replica, never for the shared pool."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = start_servers(replica("--profile", "tiny", "--pool", "local", "--block-size", "8",
                                   "--kv-events-endpoint", endpoint, "--time-scale", "0.01",
                                   "--kv-events-pool-medium", "CPU"))
    index = MemoryIndex()

    async def run() -> list[int]:
        ingest = KvIngest(index, _model_of_sim, block_tokens=16, max_blocks=10_000)
        events = EngineEvents(parse_sources([server.url], [endpoint]), ingest)
        events.start()
        try:
            ids = await send_until_precise(events, server.url)
            # The offload events trail the GPU ones (a busy machine shows the gap): wait.
            for _ in range(100):
                if ingest.tracker(server.url, local=True).held_keys():
                    break
                await asyncio.sleep(0.05)
        finally:
            await events.stop()
        assert ingest.tracker(server.url, local=True).held_keys()  # the CPU tier was seen
        return ids

    chain = token_chain(asyncio.run(run()), root_key("emulated-27b"), 16)
    found = index.lookup_now(chain)
    assert found.gpu_blocks(server.url) >= len(chain) - 1 >= 5
    assert found.pool == 0


async def _model_of_sim(replica_id: str) -> str:
    return "emulated-27b"


def test_router_subscribes_to_every_data_parallel_rank(start_servers: Any, tmp_path: Path) -> None:
    """The router process with --kv-events URL=RANK0+RANK1: a prompt stored on rank 1 only
    is the replica's; /replicas lists both ranks."""
    tok_dir = make_tokenizer(tmp_path, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    rep = start_servers(replica())
    ranks = [Publisher(), Publisher()]
    try:
        lm = start_servers(router_server([rep.url], "--tokenizer", str(tok_dir), "--kv-events",
                                         f"{rep.url}={ranks[0].endpoint}+{ranks[1].endpoint}"))
        body = {"model": "emulated-27b",
                "messages": [{"role": "user", "content": "data parallel ranks " * 200}]}
        ids = ChatTokenizer.from_dir(tok_dir).ids(body, "chat")
        [event] = stores(ids, 32, [])
        found: dict[str, Any] = {}
        for seq in range(200):  # the SUB joins asynchronously: resend until it is through
            ranks[1].send(seq, [event])
            found = httpx.post(lm.url + "/index/lookup", json=body).json()
            if found["gpu"]:
                break
        assert found["gpu"] == {rep.url: found["chain_blocks"]} and found["chain_blocks"] >= 2
        [status] = httpx.get(lm.url + "/replicas").json()["replicas"]
        per_rank = status["index"]["ranks"]
        assert [(r["rank"], r["endpoint"]) for r in per_rank] == [
            (0, ranks[0].endpoint), (1, ranks[1].endpoint)]
        assert per_rank[0]["batches"] == 0 < per_rank[1]["batches"]
        assert status["index"]["mode"] == "precise"
    finally:
        for rank in ranks:
            rank.close()


def _offloads(hashes: Sequence[int], chunk: int, self_describing: bool) -> list[dict[str, Any]]:
    """vLLM's OffloadingConnector stores of ``hashes`` (32-token GPU blocks) in chunks of
    ``chunk`` blocks: by default one placeholder per chunk (the chunk's last GPU block
    hash, no token ids, parent or size); with ``self_describing_kv_events`` every block
    of the chunk with its tokens and parent, ``extra_keys`` None."""
    out = []
    for c in range(len(hashes) // chunk):
        part = hashes[c * chunk:(c + 1) * chunk]
        if self_describing:
            ids = IDS[c * chunk * 32:(c + 1) * chunk * 32]
            out.append(block_stored(part, hashes[c * chunk - 1] if c else None, ids, 32, "CPU"))
        else:
            placeholder = block_stored(part[-1:], None, [], 0, "CPU")
            placeholder.pop("kv_cache_spec_kind")
            out.append(placeholder)
    return out


@pytest.mark.parametrize("self_describing", [False, True])
@pytest.mark.parametrize("salt", [None, "tenantA"])
async def test_vllm_cpu_offload_events_are_keyed_from_the_gpu_blocks(
        self_describing: bool, salt: str | None) -> None:
    """vLLM's CPU offload events (medium "CPU") name GPU block hashes the replica's GPU
    scope has keyed: the offloaded chunks stay the replica's after the GPU evicts them,
    with the request's salted root, until the CPU tier removes them (a placeholder
    removal names the chunk's last block only)."""
    index = MemoryIndex()
    ingest = KvIngest(index, _model, block_tokens=256, max_blocks=10_000)
    events = EngineEvents(parse_sources([R], ["tcp://127.0.0.1:1"]), ingest)
    state = events.states[R]
    hashes = engine_hashes(IDS, 32)
    [gpu] = stores(IDS, 32, [])
    if salt is not None:
        gpu["extra_keys"] = [[salt]] + [None] * (len(hashes) - 1)
    chain = token_chain(IDS, root_key("m", salt), 256)

    async def apply(*batch: dict[str, Any]) -> int:
        await ingest.apply(state, msgpack.packb([0.0, list(batch), 0]))
        return index.lookup_now(chain).gpu_blocks(R)

    assert await apply(gpu) == 4
    assert await apply(*_offloads(hashes, 4, self_describing)) == 4
    assert ingest.tracked(R) == (2 * len(hashes), 0)  # every block in both scopes, none unresolved
    assert await apply(block_removed(hashes, "GPU")) == 4  # offloaded: still the replica's
    assert index.lookup_now(chain).pool == 0
    # The CPU tier evicts chunk 2 (GPU blocks 8-11: tokens 256-383, in our block 1).
    removed = hashes[8:12] if self_describing else hashes[11:12]
    assert await apply(block_removed(removed, "CPU")) == 1


async def test_batches_encoded_as_maps_are_read() -> None:
    """Newer vLLM's EventBatch is not array-like: ``{"ts", "events", "data_parallel_rank"}``."""
    index = MemoryIndex()
    ingest = KvIngest(index, _model, block_tokens=256, max_blocks=1000)
    events = EngineEvents(parse_sources([R], ["tcp://127.0.0.1:1"]), ingest)
    [store] = stores(IDS, 32, [])
    await ingest.apply(events.states[R], msgpack.packb(
        {"ts": 0.0, "events": [store], "data_parallel_rank": 0}))
    assert index.lookup_now(CHAIN).gpu_blocks(R) == 4
    for bad in ({"events": [store]}, {"ts": 0.0}, [0.0]):
        with pytest.raises(ValueError):
            await ingest.apply(events.states[R], msgpack.packb(bad))
