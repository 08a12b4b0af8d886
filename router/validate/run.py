"""Run the tiers of ``router.validate.config`` and compare each with the cold reference.

Prompts: for each length ``L`` in ``lengths`` (those that leave room for ``K`` output
tokens within the replica's ``max_model_len``), ``prompts`` prompts of exactly ``L``
token ids drawn from the deployment's vocabulary (``Deployment.vocabulary``) by a
generator seeded with ``prompt_seed`` (random per run unless given; the report names it),
each with a fresh random ``cache_salt`` (uuid4). New prompts and new salts: a run never
reuses what an earlier run or a client left in any cache, even on an engine (or pool)
that ignored ``cache_salt`` (the ``not cold`` verdict would then show on ``cold-other``).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from router.validate.client import Deployment, ValidateError
from router.validate.compare import Reply, TierResult, compare
from router.validate.config import CACHE_TIERS, TIERS, ValidateConfig


@dataclass(frozen=True, slots=True)
class Prompt:
    index: int
    ids: list[int]
    salt: str
    home: str  # replica that computes it cold (and warm)
    other: str  # replica that reads it from the pool


@dataclass(slots=True)
class Outcome:
    """A whole run: what was tested, and per tier the result."""

    replicas: list[str]
    model: str
    lengths: list[int]
    skipped_lengths: list[int]
    tiers: dict[str, TierResult] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    prompt_seed: int | None = None

    @property
    def failed(self) -> bool:
        return bool(self.errors) or any(t.verdict == "FAIL" for t in self.tiers.values())

    @property
    def exit_code(self) -> int:
        """0 pass; 1 a tier failed (or a request did); 3 inconclusive: a cache tier never
        hit a cache, or a cold one did."""
        if self.failed:
            return 1
        inconclusive = {"not exercised", "not cold"}
        return 3 if any(t.verdict in inconclusive for t in self.tiers.values()) else 0


def make_prompts(seed: int, config: ValidateConfig, replicas: list[str], vocab: list[int],
                 lengths: list[int]) -> list[Prompt]:
    rng = random.Random(seed)
    out: list[Prompt] = []
    for length in lengths:
        for _ in range(config.prompts):
            i = len(out)
            out.append(Prompt(i, rng.choices(vocab, k=length), uuid.uuid4().hex,
                              replicas[i % len(replicas)], replicas[(i + 1) % len(replicas)]))
    return out


async def _bounded(limit: int, jobs: list[Callable[[], Awaitable[Reply]]]) -> list[Reply]:
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[Reply]]) -> Reply:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


def _job(dep: Deployment, replica: str, prompt: Prompt,
         salt: str) -> Callable[[], Awaitable[Reply]]:
    return lambda: dep.complete(replica, prompt.ids, salt)


async def run_tiers(config: ValidateConfig, dep: Deployment) -> Outcome:
    """Every tier, in order (see ``router.validate.config``)."""
    room = None if dep.max_model_len is None else dep.max_model_len - config.max_tokens
    lengths = [n for n in config.lengths if room is None or n <= room]
    outcome = Outcome(dep.replicas, dep.model, lengths,
                      [n for n in config.lengths if n not in lengths])
    if not lengths:
        outcome.errors.append(f"no length fits max_model_len {dep.max_model_len}")
        return outcome
    seed = outcome.prompt_seed = (config.prompt_seed if config.prompt_seed is not None
                                  else random.randrange(2**31))
    prompts = make_prompts(seed, config, dep.replicas, await dep.vocabulary(seed), lengths)
    tiers = {t: TierResult(t, t in CACHE_TIERS) for t in TIERS}
    outcome.tiers = tiers
    plan: dict[str, Callable[[Prompt], Callable[[], Awaitable[Reply]]]] = {
        "cold": lambda p: _job(dep, p.home, p, p.salt),
        "warm": lambda p: _job(dep, p.home, p, p.salt),
        "cold-other": lambda p: _job(dep, p.other, p, uuid.uuid4().hex),
        "pool": lambda p: _job(dep, p.other, p, p.salt),
        "evicted": lambda p: _job(dep, p.home, p, p.salt),
    }
    refs: list[Reply] = []
    try:
        for tier in TIERS:
            why = await _skip(tier, config, dep)
            if why is not None:
                tiers[tier].skipped = why
                continue
            replies = await _bounded(config.concurrency, [plan[tier](p) for p in prompts])
            if tier == "cold":
                refs = replies
            result = tiers[tier]
            for p, ref, got in zip(prompts, refs, replies, strict=True):
                result.comparisons.append(compare(ref, got, config.logprob_tol))
                result.lengths.append(len(p.ids))
    except ValidateError as exc:
        outcome.errors.append(str(exc))
    return outcome


async def _skip(tier: str, config: ValidateConfig, dep: Deployment) -> str | None:
    """Why ``tier`` cannot run here (None: it runs); the evicted tier resets caches here."""
    if tier in ("cold-other", "pool") and len(dep.replicas) < 2:
        return "one replica: no other to read the pool"
    if tier == "evicted":
        if not config.evict:
            return "--no-evict"
        if not await dep.reset_prefix_caches():
            return "the engine does not serve POST /reset_prefix_cache (vLLM: VLLM_SERVER_DEV_MODE=1)"
    return None
