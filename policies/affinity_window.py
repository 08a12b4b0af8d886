"""``affinity_window``: SGLang's cache-aware rule that keeps affinity while it rebalances.

Peer: sgl-project/sglang PR 32195, "[Router] Keep cache affinity during cache-aware load
rebalancing" (``sgl-model-gateway/src/policies/cache_aware.rs``, the ``cache_aware``
policy of SGLang's model gateway). The PR was still open when read; the rule below is
taken from its description, on top of ``cache_aware.rs`` as it stands. The classic rule
(``prefix_affinity`` here) drops cache locality outright whenever the fleet is imbalanced
and picks the least loaded replica, so near saturation every request pays a full prefill
even when a lightly loaded replica already holds its prefix.
The PR keeps affinity inside a near-minimum-load window:

1. Imbalanced when both ``max_load - min_load > balance_abs_threshold`` and
   ``max_load > min_load * balance_rel_threshold`` (unchanged from the classic rule).
   Then look only at the window of replicas with
   ``load <= min_load + balance_abs_threshold``; among those, the replica holding the
   longest cached prefix of the request wins, the lighter one breaking match ties so
   rebalancing still sheds load: reason ``window-hit``. Only when no replica in the
   window holds any of the prefix does the least loaded replica win: reason ``balance``
   (the classic behaviour).
2. Balanced: the replica with the longest match wins when its match rate (matched
   prompt fraction) is above ``cache_threshold``: reason ``gpu-hit``; otherwise the least
   loaded replica: reason ``miss``.

Parameters and defaults, the SGLang model gateway's ``cache_aware`` defaults:
``balance_abs_threshold = 64``, ``balance_rel_threshold = 1.5``, ``cache_threshold = 0.3``.
The window's width is ``balance_abs_threshold`` itself (the PR adds no parameter).
``count_engine_queue`` (default ``False``) is ours, see below.

Where ours differs, and why:

- Load. SGLang's ``Worker::load()`` is the gateway's own count of requests it has in
  flight at a worker; the closest analogue is ``ReplicaView.in_flight``, used by
  default. ``count_engine_queue=True`` adds the engine's scraped ``waiting`` queue (that
  is ``ReplicaView.load``, the measure ``prefix_affinity`` uses), which sees load sent by
  other routers at the price of scrape lag.
- Match. SGLang matches the request text against an approximate per-worker radix tree of
  text it routed there and measures the match in characters. We read the GPU residency
  the router looked up (``request.residency``: leading blocks of the request's chain on
  each replica's GPU), and the match rate is ``min(blocks * block_tokens, prompt_tokens)
  / prompt_tokens`` (``blocks / chain_blocks`` when the prompt size is unknown). The
  shared pool's residency is ignored, as in ``prefix_affinity``.
- Load statistics. SGLang takes min/max load over every worker of the model, healthy or
  not; we take them over the candidates (healthy, not excluded for this request), since
  a replica that cannot be chosen should not open or widen the window.
- Ties. SGLang breaks load ties by worker order and picks one tree tenant on match ties;
  ours break remaining ties by rendezvous hashing of the session, so an idle fleet
  spreads sessions and a given session keeps choosing the same replica.

``choose`` is pure: no clock, no randomness, no state; it raises ``NoReplicaAvailable``
when no replica is healthy and not excluded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from policies.base import BasePolicy, Decision, ReplicaView, RequestView, Residency
from policies.hashing import rendezvous_rank


@dataclass(frozen=True, slots=True)
class AffinityWindowConfig:
    """Thresholds; the defaults are SGLang model gateway's ``cache_aware`` ones."""

    balance_abs_threshold: float = 64.0
    balance_rel_threshold: float = 1.5
    cache_threshold: float = 0.3
    count_engine_queue: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.balance_abs_threshold) and self.balance_abs_threshold >= 0):
            raise ValueError("balance_abs_threshold must be finite and >= 0")
        if not (math.isfinite(self.balance_rel_threshold) and self.balance_rel_threshold >= 1):
            raise ValueError("balance_rel_threshold must be finite and >= 1")
        if not 0.0 <= self.cache_threshold < 1.0:
            raise ValueError("cache_threshold must be in [0, 1)")


def match_rate(residency: Residency, replica: str, prompt_tokens: int) -> float:
    """The fraction of the prompt whose KV the replica's GPU holds, in [0, 1]."""
    blocks = residency.gpu_blocks(replica)
    if blocks <= 0:
        return 0.0
    if prompt_tokens > 0:
        return min(blocks * residency.block_tokens, prompt_tokens) / prompt_tokens
    if residency.chain_blocks > 0:
        return min(blocks, residency.chain_blocks) / residency.chain_blocks
    return 0.0


class AffinityWindow(BasePolicy):
    name: ClassVar[str] = "affinity_window"
    config_cls: ClassVar[type[AffinityWindowConfig]] = AffinityWindowConfig

    def __init__(self, config: AffinityWindowConfig | None = None) -> None:
        self.config = config or AffinityWindowConfig()

    def load_of(self, replica: ReplicaView) -> float:
        """The router's in-flight count, plus the engine queue when so configured."""
        if self.config.count_engine_queue:
            return replica.load
        return float(replica.in_flight)

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        cfg = self.config
        ranked = rendezvous_rank(request.session, self.candidates(request, replicas))
        load = {r.id: self.load_of(r) for r in ranked}
        blocks = {r.id: request.residency.gpu_blocks(r.id) for r in ranked}
        low, high = min(load.values()), max(load.values())
        imbalanced = (high - low > cfg.balance_abs_threshold
                      and high > low * cfg.balance_rel_threshold)
        if imbalanced:
            window = [r for r in ranked if load[r.id] <= low + cfg.balance_abs_threshold]
            if max(blocks[r.id] for r in window) > 0:
                best = max(window, key=lambda r: (blocks[r.id], -load[r.id]))
                return Decision(best.id, "window-hit")
            best = min(ranked, key=lambda r: load[r.id])
            return Decision(best.id, "balance")
        best = max(ranked, key=lambda r: (blocks[r.id], -load[r.id]))
        rate = match_rate(request.residency, best.id, request.prompt_tokens)
        if blocks[best.id] > 0 and rate > cfg.cache_threshold:
            return Decision(best.id, "gpu-hit")
        best = min(ranked, key=lambda r: load[r.id])
        return Decision(best.id, "miss")

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": asdict(self.config),
            "load": "in_flight + waiting" if self.config.count_engine_queue else "in_flight",
            "peer": "sgl-project/sglang PR 32195 (sgl-model-gateway cache_aware)",
        }
