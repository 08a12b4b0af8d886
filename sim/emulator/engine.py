"""The emulated replica's engines: what the server asks of one, and the replica model behind it.

Protocol. ``Engine.admit(token_ids, max_tokens, now, salt)`` plans one request at model time
``now`` (seconds, non-decreasing across calls) and returns a ``TokenSchedule``: when its
first token is due (``ttft_s``, queueing included), the time per output token, how many
prompt tokens were cached (and how many of them came from the shared pool), and an
optional callback the server runs when the first token is due (the model engine publishes
its KV events there). ``ConstantEngine`` answers with fixed times, for API tests;
``ModelEngine`` runs the replica model (``sim.replica.model``).

ModelEngine: token ids -> engine block hashes -> the model's timeline.

Hashing (the emulated engine's own, not the router's keys and not vLLM's sha256): the
prompt's token ids are cut into full blocks of ``block_size`` ids and chained,
``h_i = xxh3_64(uint32 ids of block i, seed=h_{i-1})`` with ``h_{-1} = xxh3_64(model)``,
so equal prefixes give equal hashes on every replica of one model (vLLM's property with a
fixed hash seed). A request's ``cache_salt`` is folded in before the first block, as vLLM
folds it into the first block's hash (its extra keys): ``h_{-1} = xxh3_64(salt,
seed=xxh3_64(model))``, so salted prefixes share no block (GPU or pool) with other salts,
and a store that starts a chain carries the salt in its first block's ``extra_keys``
(``[[salt], None, ...]``), where vLLM puts it and the router reads it.
The model works at the profile's chunk size ``C`` (a multiple of
``block_size``): chunk ``j``'s key is the hash of its last engine block, which stands for
the whole prefix up to it. Only whole chunks are cached, as the model's fit assumes.

Why two sizes. ``C`` is the study's 1,568-token LMCache chunk and the granularity at
which the fit matches prefixes (docs/model.md: the re-prefilled tail of each session turn
depends on it), so the pool publishes ``medium: "cpu"`` events per chunk with
``block_size = C`` and the chunk keys as hashes. LMCache's default chunk of 256 would
change the fitted session numbers, so the pool keeps ``C``. The GPU publishes
``medium: "GPU"`` events at ``block_size`` (default 16, vLLM's CUDA default; 1,568 =
98 x 16), the granularity a real engine reports; since the model caches whole chunks, the
GPU events always come in runs of ``C / block_size`` blocks and describe exactly what
the model holds. A router recomputes its own keys from the events' ``token_ids``.

The pool's medium (``pool_medium``). ``"cpu"`` (default) is LMCache: it publishes stores
only, never the chunks it evicts, so a router must age them out itself. ``"CPU"`` is vLLM's
own OffloadingConnector, the replica's host memory: it publishes stores and removals, and
a router counts it as that replica's cache, not a shared pool. Its events are vLLM's
default ones: one per chunk naming only the chunk's last GPU block hash, with no token
ids, parent or block size (``_offload``).

Events are published when the request's prefill ends (``TokenSchedule.on_first_token``), as vLLM
publishes blocks once computed: removals first (the allocation evicted them), then stores,
each contiguous run of new chunks as one ``BlockStored`` whose ``parent_block_hash``
links it to the block before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from router.prefix import pack_token_ids
from sim.emulator.kv_events import Event, KvEventPublisher, block_removed, block_stored
from sim.replica.gpu_cache import BlockKey
from sim.replica.model import ReplicaModel, ReplicaRequest, Timeline

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class TokenSchedule:
    """When a request's tokens are due, in model seconds from admission."""

    ttft_s: float
    tpot_s: float
    cached_tokens: int = 0
    corrupt: bool = False
    pool_hit_tokens: int = 0  # part of cached_tokens loaded from the shared pool
    queue_s: float = 0.0  # part of ttft_s spent waiting for the prefill engine
    on_first_token: Callable[[], None] | None = None  # e.g. publish KV events


class Engine(Protocol):
    """Plans requests; ``now`` is model time (seconds), non-decreasing across calls."""

    def admit(self, token_ids: list[int], max_tokens: int, now: float,
              salt: str | None = None) -> TokenSchedule: ...

    def kv_usage(self) -> float: ...


@dataclass
class ConstantEngine:
    """Fixed TTFT and time per output token: the engine for plain API tests."""

    ttft_s: float = 0.0
    tpot_s: float = 0.0

    def admit(self, token_ids: list[int], max_tokens: int, now: float,
              salt: str | None = None) -> TokenSchedule:
        return TokenSchedule(self.ttft_s, self.tpot_s)

    def kv_usage(self) -> float:
        return 0.0


def block_hashes(token_ids: Sequence[int], block_size: int, root: int) -> list[int]:
    """Chained xxh3-64 of each full block of ``block_size`` token ids (see module doc)."""
    data = pack_token_ids(token_ids)
    step = 4 * block_size
    out: list[int] = []
    parent = root
    for start in range(0, (len(token_ids) // block_size) * step, step):
        parent = xxhash.xxh3_64_intdigest(data[start : start + step], seed=parent)
        out.append(parent)
    return out


class ModelEngine:
    """``Engine`` over a ``ReplicaModel``; publishes KV events if given a publisher."""

    def __init__(self, model: ReplicaModel, *, model_name: str,
                 block_size: int = DEFAULT_BLOCK_SIZE,
                 publisher: KvEventPublisher | None = None, pool_medium: str = "cpu") -> None:
        chunk = model.profile.chunk_tokens
        if block_size <= 0 or chunk % block_size:
            raise ValueError(f"block size {block_size} must divide the chunk size {chunk}")
        self.model = model
        self.block_size = block_size
        self.per_chunk = chunk // block_size
        self.publisher = publisher
        self.pool_medium = pool_medium
        self.root = xxhash.xxh3_64_intdigest(model_name.encode())
        self._seq = 0
        # Engine block hashes of each chunk this GPU holds, to name them in BlockRemoved.
        self._gpu_blocks: dict[BlockKey, tuple[int, ...]] = {}
        self._offloaded: dict[BlockKey, int] = {}  # "CPU" chunk -> its last GPU block hash

    def chain(self, token_ids: Sequence[int],
              salt: str | None = None) -> tuple[list[int], list[BlockKey]]:
        """(engine block hashes of the whole chunks, chunk keys) of a prompt."""
        chunk = self.model.profile.chunk_tokens
        whole = (len(token_ids) // chunk) * chunk
        root = self.root if salt is None else xxhash.xxh3_64_intdigest(salt.encode(), self.root)
        hashes = block_hashes(token_ids[:whole], self.block_size, root)
        return hashes, hashes[self.per_chunk - 1 :: self.per_chunk]

    def admit(self, token_ids: list[int], max_tokens: int, now: float,
              salt: str | None = None) -> TokenSchedule:
        hashes, keys = self.chain(token_ids, salt)
        self._seq += 1
        plan = self.model.admit(ReplicaRequest(tuple(keys), max(1, len(token_ids)),
                                               max(1, max_tokens), now, f"r{self._seq}"))
        gpu_stored = set(plan.gpu.stored)
        for j, key in enumerate(keys):
            if key in gpu_stored:
                self._gpu_blocks[key] = tuple(hashes[j * self.per_chunk:(j + 1) * self.per_chunk])
        gpu_removed = [h for key in plan.gpu.evicted for h in self._gpu_blocks.pop(key, ())]
        events = self._events(token_ids, hashes, keys, plan, gpu_removed)
        if salt is not None:
            _salt_chain_starts(events, salt)

        def publish() -> None:
            if self.publisher is not None:
                self.publisher.publish(events)

        return TokenSchedule(ttft_s=plan.ttft_s, tpot_s=plan.tpot_s, cached_tokens=plan.cached_tokens,
                    corrupt=plan.corrupt, pool_hit_tokens=plan.pool_hit_tokens,
                    queue_s=plan.queue_s, on_first_token=publish)

    def _events(self, ids: Sequence[int], hashes: list[int], keys: list[BlockKey],
                plan: Timeline, gpu_removed: list[int]) -> list[Event]:
        if self.publisher is None:
            return []
        chunk = self.model.profile.chunk_tokens
        events: list[Event] = []
        if gpu_removed:
            events.append(block_removed(gpu_removed, "GPU"))
        if plan.pool.evicted and self.pool_medium == "CPU":  # vLLM names its last GPU block
            tails = [self._offloaded.pop(k) for k in plan.pool.evicted if k in self._offloaded]
            events.extend(block_removed([tail], "CPU") for tail in tails)
        elif plan.pool.evicted and self.pool_medium != "cpu":  # LMCache reports no eviction
            events.append(block_removed(plan.pool.evicted, self.pool_medium))
        for medium, stored in (("GPU", set(plan.gpu.stored)),
                               (self.pool_medium, set(plan.pool.stored))):
            for first, last in _runs([j for j, k in enumerate(keys) if k in stored]):
                if medium == "CPU":
                    events.extend(self._offload(hashes, keys, first, last))
                elif medium == "GPU":
                    lo, hi = first * self.per_chunk, (last + 1) * self.per_chunk
                    parent = hashes[lo - 1] if lo else None
                    events.append(block_stored(hashes[lo:hi], parent,
                                               ids[lo * self.block_size:hi * self.block_size],
                                               self.block_size, medium))
                else:
                    parent = keys[first - 1] if first else None
                    events.append(block_stored(keys[first:last + 1], parent,
                                               ids[first * chunk:(last + 1) * chunk],
                                               chunk, medium))
        return events

    def _offload(self, hashes: list[int], keys: list[BlockKey], first: int,
                 last: int) -> list[Event]:
        """vLLM's OffloadingConnector stores (default, not self-describing): per chunk one
        ``BlockStored`` naming its last GPU block, no token ids, parent or size."""
        out = []
        for j in range(first, last + 1):
            tail = hashes[min((j + 1) * self.per_chunk, len(hashes)) - 1]  # a partial last chunk
            self._offloaded[keys[j]] = tail
            out.append({**block_stored([tail], None, [], 0, "CPU"), "kv_cache_spec_kind": None})
        return out

    def kv_usage(self) -> float:
        return self.model.kv_usage()


def _salt_chain_starts(events: list[Event], salt: str) -> None:
    """vLLM's extra keys on a chain's first block: ``[[salt], None, ...]``."""
    for event in events:
        if event["type"] == "BlockStored" and event["parent_block_hash"] is None \
                and event["token_ids"]:  # not an offload placeholder (no extra keys there)
            n = len(event["block_hashes"])
            event["extra_keys"] = [[salt]] + [None] * (n - 1)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs of sorted indices as (first, last) pairs."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs
