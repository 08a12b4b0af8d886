"""``prefix_affinity``: the longest GPU prefix match wins unless load is imbalanced.

The peers' approach (SGLang's ``cache_aware``, vLLM production-stack's ``prefixaware``),
reading the residency the router looked up instead of keeping its own tree:

1. Load is imbalanced when both ``max_load - min_load > balance_abs_threshold`` and
   ``max_load > min_load * balance_rel_threshold`` (SGLang's rule and defaults: 32 and
   1.0001), over the candidates' ``ReplicaView.load``. Then the least loaded replica
   wins (the longer GPU match breaks load ties): reason ``balance``.
2. Otherwise, the replica whose GPU holds the longest leading run of the request's
   blocks wins (the less loaded one breaks match ties), provided that run is at least
   one block and more than ``cache_threshold`` of the chain (SGLang uses 0.5 there;
   here 0.0, so any matched block counts): reason ``gpu-hit``.
3. Otherwise, the least loaded replica: reason ``miss``.

Remaining ties go by rendezvous hashing of the session, so an idle deployment spreads
new sessions instead of sending them all to the first replica, and a given session
keeps choosing the same one. The shared pool's residency is ignored here: weighing a
pool load against a recompute is the ``locality`` policy's job. ``choose`` is pure: no
clock, no randomness, no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.base import BasePolicy, Decision, ReplicaView, RequestView
from policies.hashing import rendezvous_rank


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig:
    """Thresholds; the defaults are SGLang router's, except ``cache_threshold``."""

    balance_abs_threshold: float = 32.0
    balance_rel_threshold: float = 1.0001
    cache_threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1:
            raise ValueError("balance thresholds: abs >= 0 and rel >= 1")
        if not 0.0 <= self.cache_threshold < 1.0:
            raise ValueError("cache_threshold must be in [0, 1)")


class PrefixAffinity(BasePolicy):
    name: ClassVar[str] = "prefix_affinity"
    config_cls: ClassVar[type[PrefixAffinityConfig]] = PrefixAffinityConfig

    def __init__(self, config: PrefixAffinityConfig | None = None) -> None:
        self.config = config or PrefixAffinityConfig()

    def imbalanced(self, replicas: Sequence[ReplicaView]) -> bool:
        loads = [r.load for r in replicas]
        low, high = min(loads), max(loads)
        cfg = self.config
        return high - low > cfg.balance_abs_threshold and high > low * cfg.balance_rel_threshold

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        ranked = rendezvous_rank(request.session, self.candidates(request, replicas))
        residency = request.residency
        match = {r.id: residency.gpu_blocks(r.id) for r in ranked}
        if self.imbalanced(ranked):
            best = min(ranked, key=lambda r: (r.load, -match[r.id]))
            return Decision(best.id, "balance")
        longest = max(match.values())
        if longest > 0 and longest > self.config.cache_threshold * residency.chain_blocks:
            best = max(ranked, key=lambda r: (match[r.id], -r.load))
            return Decision(best.id, "gpu-hit")
        best = min(ranked, key=lambda r: r.load)
        return Decision(best.id, "miss")
