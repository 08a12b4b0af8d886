"""Online calibration of the cost model: per-term fleet factors, bounded per-replica deviations.

The prior (``policies.cost.CostParams``) splits a request's service time (pool load +
prefill, no queueing) into four terms, ``x = (fixed, linear, attention, load)`` seconds
(``CostParams.terms``). The calibrated prediction on replica ``r`` is

    service(r) = exp(P_r) * (t_f*x_f + t_a*x_a + t_b*x_b) + exp(L_r) * t_l*x_l

with ``t_q`` in place of ``t_f`` for a request queued behind others of ours on ``r``
(batching, below).

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
  within ``max_term`` times of the warm-up scale; each variance of the estimate bounded without
  breaking its covariance (``_bound_covariance``). The prior's belief is weighed against
  each reply by ``noise``, the scatter (standard deviation of ``log(observed /
  predicted)``) of replies around a right model: the factors start with a standard
  deviation of the warm-up scale (100 %), a reply is one measurement of variance
  ``noise**2``. (An RLS started at ``p = s**2 * I`` assumes unit noise, a 100 % scatter:
  a reply in which a term is a share ``w`` of the prediction then weighs ``w**2`` of the
  prior's belief in that term's factor, so a request kind that is rare cannot teach its
  cost.) On the vLLM pair a run sends a few recomputes among a hundred cache hits of one
  size; the hits (log scatter 0.30) fix only the sum of the fixed and per-token terms,
  and only the recomputes tell the two apart. At unit noise the fit ended predicting a
  recompute at 0.18-0.20 s where the engine took 0.25-0.35 s (a hit 0.07 s), and copied
  prefixes on that error; at ``noise`` 0.3 the same replies, replayed, end at 0.26 s, and
  live 0.30 s (docs/locality.md, "A rare request teaches its cost").
- ``P_r``, ``L_r``: one replica's deviation from the fleet (a slower card), learnt from
  the ``replica_warmup``-th observation on (replicas that serve different request mixes
  cannot tell "this replica is fast" from "this term is cheap", so the fleet's terms are
  learnt first), and only from evidence that can tell a replica's speed:

  * **Like for like, never a queued request on its own.** A request dispatched while
    others of ours were still before their first token on that replica (``queued``)
    does not measure the replica's speed: an engine that batches prefills (vLLM does)
    answers several in one step, so one of them "takes" the step and the rest a few
    milliseconds, and the step costs less than their sum. On the engine suite's two
    identical vLLM CPU replicas, per-request log residuals of queued requests were -1.5
    and -1.8 (about 0.2x the prediction) against +0.02 and +0.10 for unqueued ones: the
    replica that happened to queue more looked 4x faster, attracted more, queued more,
    and ended at the deviation bound with 76-78 % of the traffic. So deviations learn
    from requests served alone (unqueued) while every replica has ``alone_min`` of them
    (decayed weight). In a fleet so busy that nothing is served alone (the simulator
    past its knee) they learn from FIFO runs instead: a run's services telescope to its
    busy time whoever the engine served first, so one residual per run,
    ``log(sum observed / sum predicted)``, a run closed by the replica's next unqueued
    request or after ``run_max`` requests. That is exact for an engine that serves one
    prefill at a time; with batching it still credits the busier replica with the
    step's saving (runs alone left the vLLM pair at deviations 0.6-0.7 and 1.4-1.7,
    78 % of the traffic on one engine), hence the preference for requests served alone.
    Every observation, queued or not, teaches the fleet's factors; a queued one the
    queued fixed factor (below) in place of the fixed term's.
  * **Shrunk by how much and how consistent the evidence is.** Per replica, part and
    kind (alone, runs), decayed sums of log offsets from the fleet's prediction (weights
    the part's share; every replica's sums decay by ``replica_forget ** (1 / replicas)``
    per sample of any replica, so evidence ages with time, not with the replica's own
    traffic: on the vLLM pair one engine was 2x slower while the benchmark client
    started, the same as the other afterwards, and the verdict learnt in the first
    seconds outlived it on the replica that verdict starved) give the mean ``m`` and
    variance ``v`` of the replica's offset, ``n`` samples' worth. Its deviation is the
    posterior mean under a prior ``N(0, tau^2)``, ``tau = log(max_deviation) / 2``
    (identical replicas are the common case; the bound is two prior sigmas):
    ``(m - pooled mean) * n / (n + v / tau^2)``, ``v`` at least ``min_var``. On the
    CPU pair (``v`` about 0.4-0.9: two engines, the router and the client on two shared
    cores) a few dozen samples are needed to move a replica by what contention alone
    would not; a simulated 2x-slower card (``v`` near ``min_var``) is learnt in a
    handful. The pooled mean removes what every replica shares (a fleet
    factor still settling) before shrinking, so replicas with unequal evidence do not
    get unequal shares of it.
  * Centred over the replicas (what all share is the fleet factors' to learn), split by
    each part's share of the prediction, bounded by ``+-log(max_deviation)``: a replica
    whose first replies were slow would otherwise look slow for good, get no traffic,
    and never be corrected.

  Not modelled: a replica whose speed depends on the others' load (engines that share a
  host's cores). Used as overflow, it is measured only while the others are busy, and
  looks slow for it. The vLLM CPU pair did this while its engines' processes floated over
  both cores (up to 111 of 120 requests on one engine). With each engine pinned whole to
  its core, the deviations stayed within 0.90-1.11 (docs/locality.md, "Each engine pinned
  whole to its core").

**Batching** (``queued_fixed``, a fifth factor): a request queued behind others of ours
on its replica has its own factor on the fixed term, fitted with the others (a queued
reply's regressors are the four terms with its fixed term moved to this factor's place;
an unqueued one leaves it at 0). An engine that computes one prompt at a time charges each
its own fixed cost (the two factors agree); vLLM packs the prompts waiting when a step
starts into that step, so a queue of short prompts drains in about one step's fixed cost,
not one per prompt: on the engine suite's vLLM (CPU), eight cached-prefix prompts sent at
once were all answered within 96-99 ms where one alone takes 24-25 ms
(``bench/engine_batching.py``; one at a time would be 200 ms). One fixed factor for both
could fit neither: queued replies pulled it down, so a request served alone looked
cheaper than it is, while a holder's queue of hits still looked a full fixed cost per
request long (docs/locality.md, "An engine that batches its queue"). A fleet with no
queued replies never excites the factor, nor one with no unqueued replies the fixed
term's: each stays where warm-up put it (and its variance is bounded,
``_bound_covariance``). ``batching=False`` (``locality@batching=false``) keeps one fixed
factor for both, as before.

*Bounded for decisions* (``queued_bound``, default on). ``predict`` charges a queued
request at most the unqueued fixed factor; the fit (``fitted``) keeps the factor as
learnt, and ``queued_fixed_share`` shows it. Sharing a step can make a prompt's fixed
cost smaller, never larger: a queued factor above the unqueued one is waiting the queue
model did not predict, absorbed as service, and it tilts every choice between a holder
with a queue and an idle replica towards a copy. On the vLLM pair it stood at 10x and
23x the unqueued one when set 453's two copies were made (a hit queued behind one
request predicted as dear as a recompute alone), and the two ended that run equal
(docs/locality.md). The fit reads its own prediction: fed the bounded one, queued
residuals would look larger still and wind the factor up.

Residuals are clipped to ``+-log(clip)``, so one outlier moves little, and always use the
current factors, not the ones of the prediction made at dispatch: with a long queue many
requests are in flight between a prediction and its observation, and correcting each
stale prediction in full would integrate one error many times over (wind-up).

``error()`` is the EWMA (step ``alpha``) of ``|log residual|`` after warm-up: how far the
calibrated model's predictions are from what happens, so the policy can trust it less
where it is wrong (``policies.locality``). It starts at 0. ``error_bound()`` is the same
average started from the largest residual the fit accepts, ``log(clip)``, which is also
its value before warm-up ends: a model with no evidence of its accuracy is not trusted,
and the bound reaches the observed error over the first ten or so replies (``alpha``
0.2). ``locality`` widens its ties by it: on the vLLM pair the engines' first first
tokens came a second after the benchmark's opening burst, and in that second the prior,
whose recompute looks 1.6x a cache hit where that engine's is about 3x, copied prefixes
to whichever engine had the shorter queue (6 of a run's 7 copies, traced;
docs/locality.md). Pure arithmetic, no numpy: five factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Terms = tuple[float, float, float, float]  # fixed, linear, attention, load (seconds)
TERM_NAMES = ("fixed", "linear", "attention", "load")
# The fit's factors: the terms', then the fixed term's for a request queued behind others.
FACTOR_NAMES = (*TERM_NAMES, "queued_fixed")
QUEUED_FIXED = 4
_NO_DEVIATION = (1.0, 1.0)  # exp(0): a replica with no deviation learnt


def _rls_step(theta: list[float], p: list[list[float]], z: list[float], error: float,
              forget: float) -> None:
    """One recursive-least-squares update of ``theta`` and its covariance ``p`` in place.
    (Plain loops over five factors: it runs once per teaching reply.)"""
    pz = [sum(a * b for a, b in zip(row, z, strict=True)) for row in p]
    denom = forget + sum(a * b for a, b in zip(z, pz, strict=True))
    for i, row in enumerate(p):
        gain = pz[i] / denom
        theta[i] += gain * error
        for j, v in enumerate(pz):
            row[j] = (row[j] - gain * v) / forget


def _bound_covariance(p: list[list[float]], cap: float) -> None:
    """Bound each variance of ``p`` by ``cap`` as ``D p D``, ``D`` diagonal, in place.

    With forgetting, the variance of a term no request excites grows without bound (the
    pool-load term where nothing is loaded), and so would its next step. Clamping the
    diagonal alone left the covariances as they were: the matrix stopped being positive
    semi-definite, gains pointed the wrong way, and the factors ran between their bounds
    on observations that matched the prior exactly (docqa, 4 replicas: from about the
    1,250th request on). Scaling row and column ``i`` by ``sqrt(cap / p[i][i])`` keeps
    the matrix symmetric positive semi-definite (a congruence) and every correlation as
    it was."""
    big = [i for i, row in enumerate(p) if row[i] > cap]
    if not big:
        return
    # Only the rows and columns of the variances over the cap change (a variance that
    # no request excites stays there: every step of a fleet with no pool scales one).
    scale = [1.0] * len(p)
    for i in big:
        scale[i] = min(1.0, math.sqrt(cap / p[i][i]))
    for i, row in enumerate(p):
        si = scale[i]
        if i in big:
            row[:] = [v * (si * sj) for v, sj in zip(row, scale, strict=True)]
        else:
            for j in big:
                row[j] = row[j] * (si * scale[j])


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
    replica_forget: float = 0.97
    run_max: int = 8
    alone_min: float = 5.0
    min_var: float = 0.01
    batching: bool = True  # queued requests' own fixed factor (False: one for all, as before)
    queued_bound: bool = True  # ``predict`` charges at most the unqueued fixed factor
    noise: float = 0.3  # a reply's log scatter around a right model (1: unit noise, as before)
    observations: int = 0
    term_scale: list[float] = field(default_factory=lambda: [1.0] * len(FACTOR_NAMES))
    log_prefill: dict[str, float] = field(default_factory=dict)
    log_load: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    abs_error: float = 0.0
    # "alone" (unqueued requests) and "runs" -> replica -> per part (prefill, load):
    # decayed [weight, sum, sum of squares] of log offsets from the fleet's prediction
    _evidence: dict[str, dict[str, tuple[list[float], list[float]]]] = field(
        default_factory=lambda: {"alone": {}, "runs": {}})
    _runs: dict[str, list[float]] = field(default_factory=dict)  # replica -> open FIFO run
    _cov: list[list[float]] = field(default_factory=list)
    _base: float = 1.0
    _cov_cap: float = 4.0  # each variance's bound (``_bound_covariance``), set with ``_cov``
    # replica -> (exp(log_prefill), exp(log_load)), rebuilt with them (``_deviations``):
    # ``predict`` runs for every candidate of every decision, the deviations change
    # only when a reply teaches
    _scales: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A bad value would fail later, inside a reply's bookkeeping (a division by
        # ``noise``, a log of ``clip``): say so where it is set (a policy option's error).
        for name, low in (("noise", 0.0), ("clip", 1.0)):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > low):
                raise ValueError(f"{name} must be finite and > {low:g}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        if self.warmup < 1:
            raise ValueError("warmup must be >= 1")

    def predict(self, replica: str, terms: Terms, queued: bool = False) -> tuple[float, float]:
        """(pool load seconds, prefill seconds) on ``replica``, calibrated; ``queued``: the
        request will wait behind others of ours there (its fixed term's own factor)."""
        t = self.term_scale
        pre, load = self._scales.get(replica, _NO_DEVIATION)
        # Batching can only share a step's fixed cost: a queued factor above the unqueued
        # one is waiting the queue model missed, and is not charged to a queued request
        # (module docstring, "Bounded for decisions").
        fixed = t[0]
        if queued and self.batching:
            fixed = min(t[QUEUED_FIXED], fixed) if self.queued_bound else t[QUEUED_FIXED]
        return t[3] * terms[3] * load, (fixed * terms[0] + t[1] * terms[1] + t[2] * terms[2]) * pre

    def fitted(self, replica: str, terms: Terms, queued: bool) -> float:
        """The fit's own prediction of service seconds: ``predict`` without its bound on
        the queued fixed factor, so the fit sees its residuals as they are."""
        t = self.term_scale
        pre, load = self._scales.get(replica, _NO_DEVIATION)
        fixed = t[self._fixed(queued)]
        return t[3] * terms[3] * load + (fixed * terms[0] + t[1] * terms[1] + t[2] * terms[2]) * pre

    def work(self, terms: Terms) -> float:
        """Seconds of service the fleet's typical replica needs for ``terms``: the work a
        placement causes, whichever replica does it (no replica's deviation)."""
        return self._fleet(terms)[1]

    def factors(self) -> dict[str, float]:
        """The term factors by name (``FACTOR_NAMES``), as ``GET /policy`` shows them."""
        return dict(zip(FACTOR_NAMES, self.term_scale, strict=True))

    def fleet_scale(self) -> float:
        """One number for dashboards: the geometric mean of the term factors."""
        return math.exp(sum(math.log(v) for v in self.term_scale[:4]) / 4)

    def _fixed(self, queued: bool) -> int:
        """The index of the factor on the fixed term: the queued one (``batching``) or not."""
        return QUEUED_FIXED if queued and self.batching else 0

    def queued_fixed_share(self) -> float:
        """What a queued request pays of the fixed term, by the fit (1: one prompt at a
        time; below: an engine that batches the prompts waiting for a step; 1 when
        ``batching`` is off)."""
        if not self.batching:
            return 1.0
        return self.term_scale[QUEUED_FIXED] / self.term_scale[0]

    def error(self) -> float:
        """EWMA of |log(observed / predicted)| after warm-up (0 until then)."""
        return self.abs_error

    def error_bound(self) -> float:
        """The error with no evidence counted as the worst: ``log(clip)`` until warm-up
        ends, then the same EWMA as ``error()`` started from there (module docstring).
        Both averages take the same steps, so they differ by the start's ``log(clip)``
        times ``(1 - alpha)`` per step: no second average is kept."""
        steps = self.observations - self.warmup
        return self.abs_error + math.log(self.clip) * (1 - self.alpha) ** max(0, steps)

    def trust(self) -> float:
        """How far the model's predictions may be counted on, ``1 - error_bound() /
        log(clip)``: 0 while the bound is the worst error the clip allows (no evidence),
        towards 1 as the bound falls; never below 0."""
        return max(0.0, 1 - self.error_bound() / math.log(self.clip))

    def update(self, replica: str, terms: Terms, observed_s: float,
               queued: bool = False) -> float | None:
        """Fold one observed service time in; returns the log residual it carried.
        ``queued``: it waited behind others of ours on ``replica`` (its time may be 0: an
        engine that batches answers a run of queued requests together)."""
        service = self.fitted(replica, terms, queued)
        if service <= 0 or observed_s < 0 or (observed_s == 0 and not queued):
            return None
        r = (self._update_fleet(replica, terms, service, observed_s, queued) if observed_s > 0
             else None)
        if self.observations > self.replica_warmup:
            if not queued:
                share, rest = self._offset(terms, observed_s, 1.0)
                self._update_replica("alone", replica, share, rest)
            if self._add_to_run(replica, terms, observed_s, queued) or not queued:
                self._deviations()  # once, from all this reply's evidence
        return r

    def _offset(self, terms: Terms, observed_s: float, count: float) -> tuple[float, float]:
        """(load's share, clipped log offset) of ``observed_s`` from the fleet's prediction
        of ``count`` such requests (no deviation: this is what deviations are made of)."""
        load, fleet = self._fleet(terms)
        bound = math.log(self.clip)
        return load / fleet, max(-bound, min(bound, math.log(observed_s / (count * fleet))))

    def _fleet(self, terms: Terms, queued: bool = False) -> tuple[float, float]:
        """(load part, total) of the fleet's prediction: no replica's deviation in it."""
        t = self.term_scale
        load = t[3] * terms[3]
        fixed = t[self._fixed(queued)] * terms[0]
        return load, load + fixed + t[1] * terms[1] + t[2] * terms[2]

    def _update_fleet(self, replica: str, terms: Terms, service: float,
                      observed_s: float, queued: bool) -> float:
        r = math.log(observed_s / service)
        self.observations += 1
        self.count[replica] = self.count.get(replica, 0) + 1
        if self.observations <= self.warmup:
            scale = math.exp(math.log(self.term_scale[0]) + r / self.observations)
            self.term_scale = [scale] * len(FACTOR_NAMES)
            return r
        bound = math.log(self.clip)
        r = max(-bound, min(bound, r))
        self.abs_error += self.alpha * (abs(r) - self.abs_error)
        self._update_terms(replica, terms, service, math.exp(r), queued)
        return r

    def _add_to_run(self, replica: str, terms: Terms, observed_s: float, queued: bool) -> bool:
        """Sum a FIFO run's observed and predicted (fleet, no deviation) times: within a run
        the split of time between requests is the engine's scheduler's, its total is not.
        Returns whether a run closed (new evidence)."""
        closed = False if queued else self._close_run(replica)
        load, fleet = self._fleet(terms, queued)
        run = self._runs.setdefault(replica, [0.0] * 4)  # count, observed, load, fleet
        run[0] += 1.0
        run[1] += observed_s
        run[2] += load
        run[3] += fleet
        if run[0] >= self.run_max:
            closed = self._close_run(replica) or closed
        return closed

    def _close_run(self, replica: str) -> bool:
        run = self._runs.pop(replica, None)
        if run is None or run[1] <= 0 or run[3] <= 0:
            return False
        bound = math.log(self.clip)
        rest = max(-bound, min(bound, math.log(run[1] / run[3])))
        self._update_replica("runs", replica, run[2] / run[3], rest)
        return True

    def _update_terms(self, replica: str, terms: Terms, service: float, ratio: float,
                      queued: bool) -> None:
        if not self._cov:  # after warm-up: one scale known, each term's share free
            self._base = self.term_scale[0]
            s2 = self._base ** 2 / self.noise ** 2  # the prior's variance, in replies' units
            self._cov_cap = 4.0 * self._base ** 2 / self.noise ** 2
            n = len(FACTOR_NAMES)
            self._cov = [[s2 if i == j else 0.0 for j in range(n)] for i in range(n)]
        dev_pre, dev_load = self._scales.get(replica, _NO_DEVIATION)
        z = [0.0, terms[1] * dev_pre / service, terms[2] * dev_pre / service,
             terms[3] * dev_load / service, 0.0]
        # A queued request's fixed term excites its own factor, an unqueued one the other.
        z[self._fixed(queued)] = terms[0] * dev_pre / service
        _rls_step(self.term_scale, self._cov, z, ratio - 1.0, self.forget)
        low, high = self._base / self.max_term, self._base * self.max_term
        for i, v in enumerate(self.term_scale):  # a term never excited must not drift,
            if not low <= v <= high:               # nor go negative
                self.term_scale[i] = max(low, min(high, v))
        _bound_covariance(self._cov, self._cov_cap)

    def _update_replica(self, kind: str, replica: str, share_load: float, r: float) -> None:
        evidence = self._evidence[kind]
        evidence.setdefault(replica, ([0.0] * 3, [0.0] * 3))
        # Evidence ages with the fleet's samples, not the replica's own: a replica that
        # gets little traffic must not keep an old verdict for good (it was learnt in a
        # moment of contention, and is why it gets little traffic); its evidence fades,
        # its deviation shrinks back towards 1, and it gets the traffic to be re-measured.
        k = self.replica_forget ** (1.0 / len(evidence))
        for rid, parts in evidence.items():
            for part, share in zip(parts, (1.0 - share_load, share_load), strict=True):
                new = share if rid == replica else 0.0
                part[0] = k * part[0] + new
                part[1] = k * part[1] + new * r
                part[2] = k * part[2] + new * r * r

    def _deviations(self) -> None:
        # Like for like: unqueued requests while every replica has enough of them (no
        # batching in them), else runs (a busy fleet, where nothing is served alone).
        alone, runs = self._evidence["alone"], self._evidence["runs"]
        enough = (all(rid in alone for rid in runs)
                  and all(a[0][0] + a[1][0] >= self.alone_min for a in alone.values()))
        evidence = alone if enough else runs
        bound = math.log(self.max_deviation)
        prior_var = (bound / 2) ** 2
        for index, table in enumerate((self.log_prefill, self.log_load)):
            parts = {rid: sums[index] for rid, sums in evidence.items()}
            weight = sum(p[0] for p in parts.values())
            if weight <= 0:
                continue
            # What all replicas share (a fleet factor still settling) is the fleet's:
            # each replica's offset from the pooled mean, shrunk, then centred.
            common = sum(p[1] for p in parts.values()) / weight
            shrunk = {rid: self._shrunk(p, common, prior_var) for rid, p in parts.items()}
            mean = sum(shrunk.values()) / len(shrunk)
            for rid, value in shrunk.items():
                table[rid] = max(-bound, min(bound, value - mean))
        self._rescale()

    def set_deviation(self, replica: str, log_prefill: float, log_load: float = 0.0) -> None:
        """Set ``replica``'s log deviations (a test's or an operator's belief; learning
        moves them on)."""
        self.log_prefill[replica] = log_prefill
        self.log_load[replica] = log_load
        self._rescale()

    def _rescale(self) -> None:
        self._scales = {rid: (math.exp(self.log_prefill.get(rid, 0.0)),
                              math.exp(self.log_load.get(rid, 0.0)))
                        for rid in self.log_prefill.keys() | self.log_load.keys()}

    def _shrunk(self, part: list[float], common: float, prior_var: float) -> float:
        """Posterior mean of a replica's log offset from ``common`` under a prior
        N(0, prior_var): few or inconsistent samples say ~0, many consistent ones their mean."""
        n, total, squares = part
        if n <= 0:
            return 0.0
        mean = total / n
        var = max(self.min_var, squares / n - mean * mean)
        return (mean - common) * n / (n + var / prior_var)

    def as_json(self) -> dict[str, object]:
        return {"fleet_scale": self.fleet_scale(), "observations": self.observations,
                "prediction_error": self.abs_error,
                "error_bound": self.error_bound(),
                "term_scale": self.factors(),
                "queued_fixed_share": self.queued_fixed_share(),
                "replicas": {rid: {"prefill_deviation": math.exp(self.log_prefill.get(rid, 0.0)),
                                   "load_deviation": math.exp(self.log_load.get(rid, 0.0)),
                                   "observations": self.count[rid]}
                             for rid in sorted(self.count)}}


@dataclass(slots=True)
class Stride:
    """Which of a replica's replies teach calibration: every ``k``-th, ``k`` = the
    replica's reply rate over ``rate`` rounded up (at least 1), the rate an EWMA (weight ``1/16``)
    of the intervals between its replies.

    A reply costs calibration ~12 us of CPU in a loop, ~50 us inside the router (its
    working set out of cache); at thousands of short replies per second on a fast engine
    that is a sixth of the router's CPU per request, and those replies teach nothing new:
    with forgetting per sample, the fit's memory shrinks to a fraction of a second. Every
    ``k``-th by count, not the first after each ``1/rate`` seconds: picking by time
    favours the replies that ended long intervals, and in a busy FIFO a reply's service
    is its interval, so the fit would learn that the replica is slower than it is. An
    engine's replies at LLM rates (below ``rate``) all teach."""

    rate: float
    last: float | None = None  # the previous reply's time
    interval: float | None = None  # EWMA of the intervals (None: fewer than two replies)
    countdown: int = 0

    def take(self, at: float) -> bool:
        if self.last is not None:
            gap = max(0.0, at - self.last)
            self.interval = gap if self.interval is None else (
                self.interval + (gap - self.interval) / 16)
        self.last = at
        self.countdown -= 1
        if self.countdown > 0:
            return False
        # Rounded up, so that no more than ``rate`` a second teach (rounded down, a
        # replica replying 1.9 times ``rate`` a second taught on every reply).
        self.countdown = (max(1, math.ceil(1.0 / (self.interval * self.rate)))
                          if self.interval else 1)
        return True
