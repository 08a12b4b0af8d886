"""KV events of ``lmroute replica``: subscribe with plain pyzmq + msgpack and decode them."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from servers import Server, replica
from servers_redis import free_port

from sim.emulator.engine import block_hashes
from sim.emulator.kv_events import KvEventPublisher, block_removed, block_stored, decode_batch
from sim.replica.profiles import TINY

MODEL = "emulated-27b"


@pytest.fixture
def events_replica() -> Iterator[tuple[Server, str]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    server = replica("--profile", "tiny", "--pool", "local", "--block-size", "8",
                     "--kv-events-endpoint", endpoint, "--time-scale", "0.01").start()
    yield server, endpoint
    server.stop()


def _receive(sub: zmq.Socket[bytes], url: str, body: dict[str, Any]
             ) -> list[tuple[int, list[dict[str, Any]]]]:
    """Send ``body`` until batches arrive (a new SUB misses what precedes its join)."""
    batches: list[tuple[int, list[dict[str, Any]]]] = []
    deadline = time.monotonic() + 10
    while not batches and time.monotonic() < deadline:
        httpx.post(url + "/v1/completions", json=body, timeout=10).raise_for_status()
        while sub.poll(300):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv-events" and len(seq) == 8
            ts, events, rank = msgpack.unpackb(payload)
            assert isinstance(ts, float) and rank == 0
            batches.append((struct.unpack(">Q", seq)[0], events))
        body = {**body, "prompt": body["prompt"] + " more"}
    return batches


def test_block_stored_events_carry_the_prompt_token_ids(
        events_replica: tuple[Server, str]) -> None:
    server, endpoint = events_replica
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    try:
        prompt = "The shared pool keeps prefixes of long documents. " * 8  # ~100 tokens
        batches = _receive(sub, server.url, {"model": MODEL, "prompt": prompt, "max_tokens": 2})
    finally:
        sub.close(0)
        ctx.term()
    assert batches, "no KV events received"
    seqs = [s for s, _ in batches]
    assert seqs == sorted(seqs)
    events = batches[0][1]
    stored = {e["medium"]: e for e in events if e["type"] == "BlockStored"}
    assert set(stored) == {"GPU", "cpu"}
    gpu, cpu = stored["GPU"], stored["cpu"]
    for e in (gpu, cpu):
        assert e["parent_block_hash"] is None  # the chain starts at the first block
        assert e["token_ids"] and len(e["token_ids"]) == e["block_size"] * len(e["block_hashes"])
        assert e["kv_cache_spec_kind"] == "full_attention" and e["group_idx"] == 0
        assert {"lora_id", "lora_name", "extra_keys"} <= set(e)
    assert gpu["block_size"] == 8 and cpu["block_size"] == TINY.chunk_tokens
    assert gpu["token_ids"] == cpu["token_ids"]  # whole chunks only, on both tiers
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
    assert gpu["token_ids"] == ids[: len(gpu["token_ids"])]
    # A chunk's pool key is the engine hash of its last GPU block (one chained hash).
    assert cpu["block_hashes"] == gpu["block_hashes"][1::2]


def test_hashes_are_chained_and_identical_across_replicas() -> None:
    ids = list(range(100))
    a = block_hashes(ids, 16, root=7)
    assert len(a) == 6 and a == block_hashes([*ids, 5], 16, root=7)  # full blocks only
    assert block_hashes(ids, 16, root=8) != a  # the root (model) seeds the chain
    assert block_hashes([1, *ids[1:]], 16, root=7)[0] != a[0]
    changed = block_hashes([*ids[:20], 999, *ids[21:]], 16, root=7)
    assert changed[0] == a[0] and changed[1:] != a[1:]  # a change reaches every later block


def test_decode_batch_accepts_map_and_positional_events() -> None:
    port = free_port()
    pub = KvEventPublisher(f"tcp://127.0.0.1:{port}", clock=lambda: 1.5)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        stored = block_stored([11, 12], None, list(range(32)), 16, "GPU")
        frames: list[bytes] = []
        deadline = time.monotonic() + 5
        while not frames and time.monotonic() < deadline:
            pub.publish([stored, block_removed([11], "GPU")])
            if sub.poll(100):
                frames = sub.recv_multipart()
        topic, seq, ts, events, rank = decode_batch(frames)
        assert (topic, ts, rank) == ("kv-events", 1.5, 0)
        assert events[0] == stored and events[1]["block_hashes"] == [11]
    finally:
        sub.close(0)
        ctx.term()
        pub.close()
    old = msgpack.packb([2.0, [["BlockStored", [1], None, [0] * 16, 16, None, "GPU", None],
                               ["AllBlocksCleared"]], 0])
    _, seq, _, events, _ = decode_batch([b"kv-events", struct.pack(">Q", 3), old])
    assert seq == 3 and events[0]["medium"] == "GPU" and events[0]["block_size"] == 16
    assert events[1] == {"type": "AllBlocksCleared"}
