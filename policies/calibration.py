"""Online calibration of the cost model: per-term fleet factors, bounded per-replica deviations.

The prior (``policies.cost.CostParams``) splits a request's service time (pool load +
prefill, no queueing) into four terms, ``x = (fixed, linear, attention, load)`` seconds
(``CostParams.terms``). The calibrated prediction on replica ``r`` is

    service(r) = exp(P_r) * (t_f*x_f + t_a*x_a + t_b*x_b) + exp(L_r) * t_l*x_l

- ``t`` (one factor per term, the fleet's): a GPU, model or emulator time scale that
  differs from the prior, and a prior that is wrong in one term only (prefill 3x slower
  per token but not in its fixed part; a cached request 0.35x a cold one where the prior
  says 0.6x). A single scale cannot fit such an error: it is right for one request mix
  and wrong for another, and per-replica factors then absorb the difference, so the
  replica serving the most cache hits "learns" it is fast and attracts more (seen on
  real vLLM). ``t`` starts as one scale, the mean of the first ``warmup`` residuals
  (the only thing a few observations identify), then follows recursive least squares
  on ``observed / predicted ~ sum_i t_i * x_i / predicted`` (relative, so a 128k prefill
  does not outweigh everything else), forgetting factor ``forget``, each factor kept
  within ``max_term`` times of the warm-up scale.
- ``P_r``, ``L_r``: one replica's deviation from the fleet (a slower card), an EWMA of
  the log residual left after the fleet's update, from the ``replica_warmup``-th
  observation on (replicas that serve different request mixes cannot tell "this replica
  is fast" from "this term is cheap", so the fleet's terms are learnt first), with step
  ``alpha / 2``, centred over the replicas, split by each part's share of the
  prediction, bounded by ``+-log(max_deviation)``: a replica whose first replies were
  slow would otherwise look slow for good, get no traffic, and never be corrected.

Residuals are clipped to ``+-log(clip)``, so one outlier moves little, and always use the
current factors, not the ones of the prediction made at dispatch: with a long queue many
requests are in flight between a prediction and its observation, and correcting each
stale prediction in full would integrate one error many times over (wind-up).

``error()`` is the EWMA (step ``alpha``) of ``|log residual|`` after warm-up: how far the
calibrated model's predictions are from what happens, so the policy can trust it less
where it is wrong (``policies.locality``). Pure arithmetic, no numpy: four terms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Terms = tuple[float, float, float, float]  # fixed, linear, attention, load (seconds)
TERM_NAMES = ("fixed", "linear", "attention", "load")


def _rls_step(theta: list[float], p: list[list[float]], z: list[float], error: float,
              forget: float) -> None:
    """One recursive-least-squares update of ``theta`` and its covariance ``p`` in place."""
    pz = [sum(p[i][j] * z[j] for j in range(4)) for i in range(4)]
    denom = forget + sum(z[i] * pz[i] for i in range(4))
    gain = [v / denom for v in pz]
    for i in range(4):
        theta[i] += gain[i] * error
        for j in range(4):
            p[i][j] = (p[i][j] - gain[i] * pz[j]) / forget


@dataclass(slots=True)
class Calibration:
    """Per-term fleet factors and per-replica deviations (see the module docstring)."""

    alpha: float = 0.2
    warmup: int = 3
    clip: float = 4.0
    max_deviation: float = 2.0
    forget: float = 0.995
    max_term: float = 20.0
    replica_warmup: int = 30
    observations: int = 0
    term_scale: list[float] = field(default_factory=lambda: [1.0] * 4)
    log_prefill: dict[str, float] = field(default_factory=dict)
    log_load: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    abs_error: float = 0.0
    _cov: list[list[float]] = field(default_factory=list)
    _base: float = 1.0

    def predict(self, replica: str, terms: Terms) -> tuple[float, float]:
        """(pool load seconds, prefill seconds) on ``replica``, calibrated."""
        t = self.term_scale
        prefill = t[0] * terms[0] + t[1] * terms[1] + t[2] * terms[2]
        return (t[3] * terms[3] * math.exp(self.log_load.get(replica, 0.0)),
                prefill * math.exp(self.log_prefill.get(replica, 0.0)))

    def fleet_scale(self) -> float:
        """One number for dashboards: the geometric mean of the term factors."""
        return math.exp(sum(math.log(v) for v in self.term_scale) / 4)

    def error(self) -> float:
        """EWMA of |log(observed / predicted)| after warm-up (0 until then)."""
        return self.abs_error

    def update(self, replica: str, terms: Terms, observed_s: float) -> float | None:
        """Fold one observed service time in; returns the log residual it carried."""
        load, prefill = self.predict(replica, terms)
        service = load + prefill
        if service <= 0 or observed_s <= 0:
            return None
        r = math.log(observed_s / service)
        self.observations += 1
        self.count[replica] = self.count.get(replica, 0) + 1
        if self.observations <= self.warmup:
            scale = math.exp(math.log(self.term_scale[0]) + r / self.observations)
            self.term_scale = [scale] * 4
            return r
        bound = math.log(self.clip)
        r = max(-bound, min(bound, r))
        self.abs_error += self.alpha * (abs(r) - self.abs_error)
        self._update_terms(replica, terms, service, math.exp(r))
        # The replica's deviation learns what the fleet's factors still leave unexplained:
        # with one replica (or while the fleet is being learnt) that is little, so a
        # replica's factor does not absorb an error of the prior's terms.
        if self.observations > self.replica_warmup:
            load, prefill = self.predict(replica, terms)
            rest = max(-bound, min(bound, math.log(observed_s / (load + prefill))))
            self._update_replica(replica, load / (load + prefill), rest)
        return r

    def _update_terms(self, replica: str, terms: Terms, service: float, ratio: float) -> None:
        if not self._cov:  # after warm-up: one scale known, each term's share free
            self._base = self.term_scale[0]
            s2 = self._base ** 2
            self._cov = [[s2 if i == j else 0.0 for j in range(4)] for i in range(4)]
        dev_pre = math.exp(self.log_prefill.get(replica, 0.0))
        dev_load = math.exp(self.log_load.get(replica, 0.0))
        z = [terms[0] * dev_pre / service, terms[1] * dev_pre / service,
             terms[2] * dev_pre / service, terms[3] * dev_load / service]
        _rls_step(self.term_scale, self._cov, z, ratio - 1.0, self.forget)
        low, high = self._base / self.max_term, self._base * self.max_term
        for i in range(4):  # a term never excited must not drift, nor go negative
            self.term_scale[i] = max(low, min(high, self.term_scale[i]))
            self._cov[i][i] = min(self._cov[i][i], 4.0 * self._base ** 2)

    def _update_replica(self, replica: str, share_load: float, r: float) -> None:
        step = self.alpha / 2
        bound = math.log(self.max_deviation)
        for table, share in ((self.log_prefill, 1.0 - share_load), (self.log_load, share_load)):
            value = table.get(replica, 0.0) + step * share * r
            table[replica] = max(-bound, min(bound, value))
            # Deviations are relative to the fleet: centred, so what all replicas share
            # stays the fleet factors' to learn (one replica alone has no deviation).
            mean = sum(table.values()) / len(table)
            for rid in table:
                table[rid] -= mean

    def as_json(self) -> dict[str, object]:
        return {"fleet_scale": self.fleet_scale(), "observations": self.observations,
                "prediction_error": self.abs_error,
                "term_scale": dict(zip(TERM_NAMES, self.term_scale, strict=True)),
                "replicas": {rid: {"prefill_deviation": math.exp(self.log_prefill.get(rid, 0.0)),
                                   "load_deviation": math.exp(self.log_load.get(rid, 0.0)),
                                   "observations": self.count[rid]}
                             for rid in sorted(self.count)}}
