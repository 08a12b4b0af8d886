"""``load_aware``: vLLM production-stack's ``loadaware`` score, cache hit minus relative load.

Peer: vllm-project/production-stack PR 1035, "[Router][Feat] loadaware routing:
KV-cache-aware placement weighted by live load" (``LoadAwareRouter`` in
``src/vllm_router/routers/routing_logic.py``). Its ``kvaware`` predecessor sends a request
to the first instance holding its prefix however busy it is, so a hot prefix piles onto
one engine. ``loadaware`` scores every candidate and takes the argmax::

    score(i)         = min(matched_tokens(i), prompt_tokens) / max(prompt_tokens, 1)
                       - beta * relative_load(i)
    relative_load(i) = (load(i) - mean_load) / max(1, mean_load)

Both terms are dimensionless: the benefit is the fraction of this prompt already cached
(clamped to 1, since a match rounded up to a block boundary can exceed the prompt), and
the load is a signed fraction of this fleet's mean, recomputed per request. The mean is
clamped at 1 so an almost idle fleet reports no imbalance to act on. ``beta`` (default
``1.0``, the peer's ``DEFAULT_LOADAWARE_BETA``) is the exchange rate: a replica 100%
above the fleet's mean load forfeits one full cache hit. With two replicas the gap is
``2 * beta * r``, so at the default a full hit is cancelled at ``r = 0.5``. ``beta = 0``
is pure cache affinity. The peer applies no match threshold (its ``kv_aware_threshold``
is accepted and ignored), and neither do we. When nothing anywhere holds the prefix the
peer does not score at all: it falls back to its session hash ring (lowest QPS without a
session); reason ``miss`` here, see below. Otherwise reason ``score``.

Parameters: ``beta = 1.0`` (the peer's default; also its ``LOADAWARE_BETA`` env var, which
we do not read), ``hash_on_miss = True`` and ``count_engine_queue = False`` (ours).

Where ours differs, and why:

- Load. The peer's ``load(i)`` is ``in_prefill_requests + in_decoding_requests`` from the
  router's own event-driven ``request_stats`` (it deliberately ignores the scrape-lagged
  engine stats): requests this router has outstanding there. The closest analogue is
  ``ReplicaView.in_flight``, used by default; ``count_engine_queue=True`` adds the
  engine's scraped ``waiting`` queue (``ReplicaView.load``).
- Matched tokens. The peer asks the LMCache controller which instance holds how many of
  the prompt's tokens (any LMCache tier of that instance). We read the GPU residency the
  router looked up: ``matched_tokens = gpu_blocks * residency.block_tokens``. The shared
  pool's residency is ignored, as in ``prefix_affinity``. The peer divides by the
  tokenized prompt length; we use ``request.prompt_tokens`` (an estimate in text mode),
  or ``chain_blocks * block_tokens`` when that is 0.
- Mean. The peer averages over the endpoints it was handed; we average over the
  candidates (healthy, not excluded for this request).
- Miss fallback. With ``hash_on_miss`` (default, the peer's behaviour) a request that no
  candidate holds any block of goes to the session's rendezvous choice, our analogue of
  the peer's consistent-hash ring on the session id; our session key always exists (the
  router derives one from the prompt), so there is no QPS branch. ``hash_on_miss=False``
  scores misses too, which is then least relative load.
- Ties. The peer breaks score ties by lexicographic URL; ours by rendezvous hashing of
  the session, so an idle fleet spreads sessions and a session keeps its replica.

``choose`` is pure: no clock, no randomness, no state; it raises ``NoReplicaAvailable``
when no replica is healthy and not excluded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from policies.base import BasePolicy, Decision, ReplicaView, RequestView
from policies.hashing import rendezvous_rank


@dataclass(frozen=True, slots=True)
class LoadAwareConfig:
    """``beta`` is production-stack's default; the two switches are ours."""

    beta: float = 1.0
    hash_on_miss: bool = True
    count_engine_queue: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError("beta must be finite and >= 0")


class LoadAware(BasePolicy):
    name: ClassVar[str] = "load_aware"
    config_cls: ClassVar[type[LoadAwareConfig]] = LoadAwareConfig

    def __init__(self, config: LoadAwareConfig | None = None) -> None:
        self.config = config or LoadAwareConfig()

    def load_of(self, replica: ReplicaView) -> float:
        """The router's in-flight count, plus the engine queue when so configured."""
        if self.config.count_engine_queue:
            return replica.load
        return float(replica.in_flight)

    def relative_loads(self, replicas: Sequence[ReplicaView]) -> dict[str, float]:
        """Each replica's load as a signed fraction of the mean, the mean clamped at 1."""
        loads = {r.id: self.load_of(r) for r in replicas}
        mean = sum(loads.values()) / len(loads)
        return {rid: (x - mean) / max(1.0, mean) for rid, x in loads.items()}

    def scores(self, request: RequestView, replicas: Sequence[ReplicaView]) -> dict[str, float]:
        """``benefit - beta * relative_load`` per replica (no candidate filtering)."""
        residency = request.residency
        prompt = request.prompt_tokens or residency.chain_blocks * residency.block_tokens
        relative = self.relative_loads(replicas)
        out = {}
        for r in replicas:
            matched = residency.gpu_blocks(r.id) * residency.block_tokens
            benefit = min(matched, prompt) / max(prompt, 1)
            out[r.id] = benefit - self.config.beta * relative[r.id]
        return out

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        ranked = rendezvous_rank(request.session, self.candidates(request, replicas))
        if self.config.hash_on_miss and not any(
            request.residency.gpu_blocks(r.id) > 0 for r in ranked
        ):
            return Decision(ranked[0].id, "miss")
        score = self.scores(request, ranked)
        best = max(ranked, key=lambda r: score[r.id])
        return Decision(best.id, "score")

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": asdict(self.config),
            "load": "in_flight + waiting" if self.config.count_engine_queue else "in_flight",
            "peer": "vllm-project/production-stack PR 1035 (LoadAwareRouter)",
        }
