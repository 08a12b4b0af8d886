"""One replica, as a pure model: GPU prefix cache, shared pool, one prefill engine, decode.

The clock is injected: ``admit`` takes the request's arrival time and returns the whole
planned timeline; the model never reads wall time. A live HTTP replica calls it with a
wall-clock-derived ``arrival`` and sleeps for ``queue_s``, ``ttft_s``, ``decode_s`` (times
its time scale); a discrete-event simulator calls it with virtual time and schedules the
plan's ``first_token_at`` / ``finish_at``. Arrivals must come in non-decreasing time.

Algorithm of ``admit`` (``B`` = ``profile.chunk_tokens``):
1. Queue: one prefill at a time per replica, FIFO (vLLM schedules prompts in order and a
   long prefill occupies the engine): ``start = max(arrival, prefill_free_at)``. A prompt
   that waited (``start > arrival``) pays ``profile.queued_fixed_share`` of the fixed
   prefill term: an engine that batches the prompts waiting for a step shares its cost.
2. Lookup as of ``start``: ``g`` leading blocks on this GPU, ``p`` leading chunks in the
   pool. Hit tokens = ``max(g, p) * B`` capped at ``prompt_tokens - 1``: the engine always
   computes at least the last token to produce logits. The GPU part is free; the part
   beyond it (``p > g``) is loaded from the pool (``profile.pool_load_s``), flagged
   ``corrupt`` when the pool's fault flag is set.
3. Prefill the rest at depth (``profile.prefill_s(hit, new)``), then write-through: the
   pool chunks missing are stored (``profile.pool_store_s``), delaying the first token.
4. The prompt chain's blocks enter the GPU cache and the pool, readable from
   ``first_token_at`` (so a request elsewhere during this prefill still misses). Only the
   prompt's full blocks are cached: the reply's KV is not (the next turn re-prefills it).
5. Decode is continuous-batched, concurrent with later prefills:
   ``decode_s = (output_tokens - 1) * tpot`` with ``tpot = profile.tpot(K)``, ``K`` the
   tokens of this sequence at mid-reply plus those of every other sequence decoding at
   ``first_token_at``, fixed at admission (later arrivals do not slow it; interference of
   prefills with decode steps is not modelled).

The plan lists the keys stored and evicted in GPU and pool, so a live replica can publish
vLLM-style KV events (BlockStored/BlockRemoved, medium "GPU"; "cpu" for pool stores).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.replica.gpu_cache import NO_CHANGE, BlockKey, CacheChange, GpuPrefixCache
from sim.replica.pool import Pool
from sim.replica.profiles import Profile


@dataclass(frozen=True, slots=True)
class ReplicaRequest:
    """One request as the model sees it.

    ``chain``: the block keys of the prompt's full blocks, in order (at most
    ``prompt_tokens // chunk_tokens`` of them); ``prompt_tokens`` the whole prompt;
    ``output_tokens`` (>= 1) the reply length; ``arrival`` the caller's clock.
    """

    chain: tuple[BlockKey, ...]
    prompt_tokens: int
    output_tokens: int
    arrival: float
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class Timeline:
    """The timeline of one admitted request and the cache changes it made.

    Absolute times (``start``, ``first_token_at``, ``finish_at``) are on the caller's
    clock; ``*_s`` fields are durations. ``ttft_s = queue_s + load_s + prefill_s +
    store_s`` and ``total_s = ttft_s + decode_s``.
    """

    request_id: str
    replica: str
    arrival: float
    start: float
    first_token_at: float
    finish_at: float
    queue_s: float
    load_s: float
    prefill_s: float
    store_s: float
    decode_s: float
    tpot_s: float
    gpu_hit_tokens: int
    pool_hit_tokens: int
    prefilled_tokens: int
    prompt_tokens: int
    output_tokens: int
    corrupt: bool
    gpu: CacheChange
    pool: CacheChange

    @property
    def ttft_s(self) -> float:
        return self.first_token_at - self.arrival

    @property
    def total_s(self) -> float:
        return self.finish_at - self.arrival

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens not computed: what ``vllm:prompt_tokens_cached_total`` counts."""
        return self.gpu_hit_tokens + self.pool_hit_tokens


class ReplicaModel:
    """One replica: GPU prefix cache, access to a shared pool, a FIFO prefill engine."""

    def __init__(self, replica: str, profile: Profile, pool: Pool | None = None) -> None:
        if pool is not None and (
            pool.chunk_tokens != profile.chunk_tokens
            or pool.bytes_per_token != profile.bytes_per_token
        ):
            raise ValueError("pool and profile disagree on chunk size or bytes per token")
        self.replica = replica
        self.profile = profile
        self.pool = pool
        self.gpu = GpuPrefixCache(profile.gpu_capacity_blocks)
        self.prefill_free_at = 0.0  # when the prefill engine takes the next prompt
        self._last_arrival = float("-inf")
        self._active: list[Timeline] = []  # admitted, unfinished as of the last arrival

    def admit(self, request: ReplicaRequest) -> Timeline:
        """Plan ``request`` (see the module docstring) and commit its cache changes."""
        prof = self.profile
        now = request.arrival
        self._check(request)
        self._last_arrival = now
        self._active = [p for p in self._active if p.finish_at > now]

        chain = request.chain
        start = max(now, self.prefill_free_at)
        pool = self.pool if self.pool is not None and self.pool.enabled else None
        gpu_blocks = self.gpu.longest_prefix(chain, at=start)
        pool_blocks = pool.contains_prefix(chain, at=start) if pool is not None else 0
        hit = min(max(gpu_blocks, pool_blocks) * prof.chunk_tokens, request.prompt_tokens - 1)
        gpu_hit = min(gpu_blocks * prof.chunk_tokens, hit)
        pool_hit = hit - gpu_hit
        new = request.prompt_tokens - hit

        corrupt = False
        if pool is not None and pool_hit > 0:
            corrupt = pool.record_load(max(0, pool_blocks - gpu_blocks))
        load_s = prof.pool_load_s(pool_hit)
        prefill_s = prof.prefill_s(hit, new, queued=start > now)
        missing = pool.count_missing(chain) if pool is not None else 0
        store_s = prof.pool_store_s(missing * prof.chunk_tokens)
        first_token_at = start + load_s + prefill_s + store_s
        self.prefill_free_at = first_token_at

        gpu_change = self.gpu.insert(chain, ready_at=first_token_at)
        pool_change = pool.store(chain, ready_at=first_token_at) if pool is not None else NO_CHANGE

        tpot = self._tpot(request, first_token_at)
        decode_s = (request.output_tokens - 1) * tpot
        plan = Timeline(
            request_id=request.request_id,
            replica=self.replica,
            arrival=now,
            start=start,
            first_token_at=first_token_at,
            finish_at=first_token_at + decode_s,
            queue_s=start - now,
            load_s=load_s,
            prefill_s=prefill_s,
            store_s=store_s,
            decode_s=decode_s,
            tpot_s=tpot,
            gpu_hit_tokens=gpu_hit,
            pool_hit_tokens=pool_hit,
            prefilled_tokens=new,
            prompt_tokens=request.prompt_tokens,
            output_tokens=request.output_tokens,
            corrupt=corrupt,
            gpu=gpu_change,
            pool=pool_change,
        )
        self._active.append(plan)
        return plan

    def _check(self, request: ReplicaRequest) -> None:
        if request.arrival < self._last_arrival:
            raise ValueError(f"arrival {request.arrival} before the previous one "
                             f"{self._last_arrival}")
        if request.output_tokens < 1 or request.prompt_tokens < 1:
            raise ValueError("prompt_tokens and output_tokens must be at least 1")
        if len(request.chain) * self.profile.chunk_tokens > request.prompt_tokens:
            raise ValueError("chain has more full blocks than the prompt has tokens")

    def _tpot(self, request: ReplicaRequest, first_token_at: float) -> float:
        """Decode step time: the KV read per step is this sequence at mid-reply plus the
        others decoding at its first token."""
        own = request.prompt_tokens + request.output_tokens / 2
        others = sum(
            p.prompt_tokens + p.output_tokens / 2 for p in self._active_at(first_token_at)
        )
        return self.profile.tpot(own + others)

    def _active_at(self, t: float) -> list[Timeline]:
        return [p for p in self._active if p.first_token_at <= t < p.finish_at]

    def waiting(self, now: float) -> int:
        """Admitted requests whose prefill has not started by ``now``."""
        return sum(1 for p in self._active if p.start > now)

    def running(self, now: float) -> int:
        """Admitted requests prefilling or decoding at ``now``."""
        return sum(1 for p in self._active if p.start <= now < p.finish_at)

    def kv_usage(self) -> float:
        """GPU prefix-cache occupancy, 0..1."""
        return self.gpu.usage

    def restart(self) -> tuple[BlockKey, ...]:
        """An engine restart: empty GPU cache and queue; returns the blocks dropped."""
        self._active.clear()
        self.prefill_free_at = 0.0
        self._last_arrival = float("-inf")
        return self.gpu.clear()
