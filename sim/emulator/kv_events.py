"""vLLM-format KV-cache events from an emulated replica, published over ZMQ.

Wire format (vLLM's ``ZmqEventPublisher``, ``vllm/distributed/kv_events.py``):

- a PUB socket *bound* at the endpoint (``tcp://127.0.0.1:5557``); subscribers connect and
  filter on the topic (default ``kv-events``);
- each message is multipart ``[topic, seq, payload]``: ``seq`` an 8-byte big-endian
  unsigned sequence number starting at 0 per publisher (it restarts with the engine, as
  vLLM's does), ``payload`` msgpack of ``[ts, events, data_parallel_rank]``;
- each event is a map with ``"type"`` (the encoding since vLLM PR #42892):
  ``BlockStored`` {block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window},
  ``BlockRemoved`` {block_hashes, medium, group_idx}, ``AllBlocksCleared`` {}.
  ``medium`` is ``"GPU"`` for the engine's prefix cache, ``"cpu"`` for LMCache stores
  (LMCache publishes no removals) and ``"CPU"`` for vLLM's own CPU offload.

One batch per engine step: the replica publishes a request's stores and evictions together
when its prefill ends (when vLLM would have written the blocks). ``decode_batch`` parses
both the map and the older positional-array encodings, for tests and tools.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import zmq

DEFAULT_TOPIC = "kv-events"
Event = dict[str, Any]


def block_stored(
    block_hashes: Sequence[int],
    parent_block_hash: int | None,
    token_ids: Sequence[int],
    block_size: int,
    medium: str,
) -> Event:
    """A map-encoded ``BlockStored`` event for a full-attention model without LoRA."""
    return {
        "type": "BlockStored",
        "block_hashes": list(block_hashes),
        "parent_block_hash": parent_block_hash,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": None,
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
        "kv_cache_spec_sliding_window": None,
    }


def block_removed(block_hashes: Sequence[int], medium: str) -> Event:
    return {"type": "BlockRemoved", "block_hashes": list(block_hashes), "medium": medium,
            "group_idx": 0}


def all_blocks_cleared() -> Event:
    return {"type": "AllBlocksCleared"}


class KvEventPublisher:
    """PUB socket bound at ``endpoint``; ``publish(events)`` sends one batch."""

    def __init__(self, endpoint: str, topic: str = DEFAULT_TOPIC, rank: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        # vLLM binds when the address has "*"; we always bind, so tests can connect to a
        # concrete loopback port the replica owns.
        self._sock.bind(endpoint)
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.rank = rank
        self.clock = clock
        self.seq = 0

    def publish(self, events: Sequence[Event]) -> None:
        if not events:
            return
        payload = msgpack.packb([self.clock(), list(events), self.rank], use_bin_type=True)
        # NOBLOCK: a PUB socket drops at its high-water mark rather than block the engine.
        self._sock.send_multipart([self.topic, struct.pack(">Q", self.seq), payload],
                                  flags=zmq.NOBLOCK)
        self.seq += 1

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


_POSITIONAL = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def decode_batch(frames: Sequence[bytes]) -> tuple[str, int, float, list[Event], int]:
    """``[topic, seq, payload]`` -> (topic, seq, ts, events as maps, rank)."""
    topic, seq_bytes, payload = frames
    (seq,) = struct.unpack(">Q", seq_bytes)
    ts, raw_events, rank = msgpack.unpackb(payload, raw=False)
    events: list[Event] = []
    for raw in raw_events:
        if isinstance(raw, dict):
            events.append(raw)
        else:  # before vLLM PR #42892: [tag, field, field, ...]
            tag, *values = raw
            events.append({"type": tag, **dict(zip(_POSITIONAL.get(tag, ()), values,
                                                   strict=False))})
    return topic.decode(), seq, float(ts), events, int(rank)
