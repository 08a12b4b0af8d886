"""``locality``: send each request where its predicted time to first token is lowest.

For every healthy candidate replica ``r`` the cost model (``policies.cost``) predicts

    ttft(r) = wait(r) + pool load of the pool prefix beyond r's GPU prefix
                      + prefill of the rest (superlinear in context)

from the residency the router looked up (r's GPU prefix, the pool prefix) and the prefill
work already admitted on ``r``. The score to minimise is

    score(r) = ttft(r) + work_weight * (work(r) - min over replicas of work)
                       + work_weight * q(r) * service(r)

where service = pool load + prefill on r, and work the same for the fleet's typical
replica (``Calibration.work``: r's deviation is in its service, and counted again here it
made a replica believed 2x slower score 3x). A placement that recomputes what another
replica could load or hit makes everyone queued behind it wait too, so extra work is
charged (``work_weight``, default 1). And every second of work placed on ``r`` delays the
requests that will queue behind it there before its queue drains, about as many as are
queued now: ``q(r)`` = r's predicted wait over the mean observed service time (0 on an
idle replica; off with ``load_aware_work=false``): without it greedy moves added
recomputes when the fleet was short of capacity, and a fleet-wide multiplier herded a
tenant's sessions onto its system prompt's replica; ``q(r)`` charges work where it waits.
For a router that has seen no other router's requests, ``q(r)`` is at most the arrivals
Little's law expects while the placement waits and is served, r's recent dispatch rate
times (wait + service) (``sojourn_arrivals_s``, ``policies.dispatch_rate``): past the
knee that is the queue's length or more, but at light load a burst's queue is gone
before the next arrival, and charged as if it would last, one queued hit made the vLLM
pair copy a prefix (another router's arrivals are not in our rate, so with several
routers the queue's length stands).
Returning sessions (``returning``, ``policies.returning``): ``q(r)`` also counts, at half
weight, the sessions between turns bound to ``r`` expected back during the service (not
for a prefix others read now: that is priced by a copy's benefit, below).
Shared copies (``shared_copies``): the extra-work charge is divided by 1 + the request's
``Residency.readers`` (the router's unsettled requests holding its longest indexed
prefix): a copy of a document many are reading right now serves them all, and charged
as one request's loss it waited until the holder's queue was twice its prefill long.
A copy's benefit (``copy_benefit``, ``policies.copy_benefit``): it also serves the
prefix's later readers, who would queue at its holder: a replica that would copy scores
lower by what the readers in flight would save, never below its score as a holder.
Own dispatch log (``policies.session_log``): a session's replica is its own last
dispatch's, whose prompt counts as cached there while in flight (the router records it
only when the reply ends; other sessions find prefixes in flight via ``router.in_flight``).
Hysteresis: the session's last replica is kept unless another scores better by more than
``stay_margin`` (relative; widened by ``distrust`` x the cost model's own running error,
``Calibration.error()``, times the share of the prompt the kept replica's GPU holds beyond
the other's: a model that predicts badly moves sessions only for gains larger than its
errors, falling back towards keeping them put where cache locality is what is known for
sure, and towards balance where the kept replica holds nothing more) plus
``stay_margin_s``: a session never moves for nothing (with no pool, moving recomputes).

Ties: replicas whose scores are within ``tie_margin`` (relative; widened, as the
hysteresis is, by ``distrust`` x the model's running error) of the best are not told
apart by a model made of estimates (deviations of identical replicas differ by 10-20 %
from noise alone); among them those whose placement adds no work beyond the least win
(``tie_work``: a copy's or a recompute's work is certain, the balance it buys is within
the model's error; settled by the queues, ties copied each of the vLLM pair's 8 shared
prefixes to both engines, hit rate 0.80 against 0.86), then the fewest of our requests
queued (for a prompt no candidate holds, and no other router's requests on them, plus
the readers expected of the new prefixes placed on each lately: ``policies.new_prefixes``,
``new_balance_s`` its decay's time constant; at light load the queues are empty, and new
prefixes placed by a hash land unevenly and keep their readers there:
``prefix_affinity``, which places by the prefix's hash, split the pair's 120 requests
90/30 in one run), then the fewest in flight (replies still streaming: their sessions
will come back), then, for a prompt no candidate holds, the least predicted service
dispatched lately, then the session's rendezvous order (the only order when another
router's requests are on a candidate: it is the one all routers agree on). Without it,
the replica the calibration believes faster wins every tie, and at low load nearly
every request is one. Cheap copies (``cheap_copy``, off by default; docs/locality.md,
"Cheap copies"): a copy or a recompute of an indexed prefix whose extra work is at most
``cheap_copy`` x the mean observed service time is tied when its score less that work's
charge is within the margin, and is taken only where fewer of our requests are queued
than at every tied candidate that adds no work. On the vLLM CPU pair a 1,500-token
prefix costs about half a service to recompute, and keeping each prefix on one engine
left its arrivals behind longer queues than ``least_loaded``'s (one copy of each prefix,
then the count); a 32k-128k document costs many services, and copying it whenever the
count said so lost the gauntlet's ``docqa`` cells (up to 4x at the knee without a pool).
A prompt that no candidate holds any of, as far as this router knows, and that is at
least 16,384 tokens long goes by its prefix's order instead
(``anchored``; ``RequestView.anchor``, the key of its first 16,384 tokens; a shorter
prompt's would change with each turn): routers that do not share placements then send
a new document's first readers to one replica, where each computed it on its own (4
routers, `docqa`: every document computed 3-4 times in the first seconds, a backlog
that took minutes to drain).

Wait (FIFO, one prefill at a time per replica, as vLLM schedules long prefills): the
requests this policy dispatched to ``r`` and whose first token has not arrived form a
queue; walking it from ``r``'s last first token, each starts at ``max(previous end, its
dispatch)`` and lasts its predicted service; an overdue head is assumed about to finish.
``wait(r)`` is where the walk ends, minus now. Entries leave on ``observe`` (first token,
end, or failure). Other routers' requests waiting at the engine (``ReplicaView.others``)
add ``their count x r's mean observed service time``, where a reply served among
other routers' requests counts as its predicted service (its observed time holds theirs).

Reasons: ``sticky`` (kept on the session's replica), ``gpu-hit`` / ``pool-hit`` / ``miss``
(what the chosen replica will do), ``balance`` (not the replica holding the most cached
tokens), ``failover`` (the session's replica is gone or failed this request).
The last 16 copies (``balance``), with what each decision saw and the copy's own time to
first token, are in ``describe()`` (``policies.copy_log``).

Calibration (``policies.calibration``): each first token gives an observed service time,
``first token - max(its dispatch, r's previous first token)`` (FIFO), which updates the
fleet's factor on each term of the cost model and each replica's bounded deviation, so
the prior (the study fit) adapts to the hardware; beyond ``calibration_rate`` replies a
second on a replica, one in every k teaches (``Stride``). Replies served among other
routers' requests teach nothing, nor do replies whose engine-reported cached share is
further than ``split_tolerance`` from the estimate's (``_learn``), so a first token's
lesson waits for the reply's end, where that count is (``_Sample``). ``choose`` is pure
(it memoises its estimates only for the ``dispatched`` that follows): time comes from
``RequestView.now``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from policies import copy_benefit
from policies.base import BasePolicy, Decision, Outcome, ReplicaView, RequestView
from policies.calibration import Calibration, Stride, Terms
from policies.copy_log import CopyLog
from policies.cost import STUDY_PRIOR, CostParams, Estimate, split_tokens
from policies.dispatch_rate import DispatchRate
from policies.fifo_queue import FifoQueue
from policies.hashing import rendezvous_rank
from policies.new_prefixes import NewPrefixes
from policies.returning import Returning
from policies.session_log import SessionLog

# Built by mypyc (setup.py, ``LMROUTE_MYPYC=1``): this module is then an extension.
COMPILED = not __file__.endswith(".py")


@dataclass(frozen=True, slots=True)
class LocalityConfig:
    """``prior``: the cost model's prior (``policies.cost``; from a file with
    ``locality@prior=PATH``, default the built-in study fit);
    ``work_weight``: seconds of score per second of extra work a placement causes;
    ``load_aware_work``: multiply it by 1 + the requests queued per replica;
    ``stay_margin``: relative advantage another replica needs to take a session away;
    ``stay_margin_s``: the same in absolute seconds (added); ``tie_margin``: scores
    within it (relative) of the best are ties, broken by balance; ``distrust``: the tie
    margin grows by this times the calibrated model's own error, the stay margin by that
    times the prompt's share only the kept replica's GPU holds; ``calibrate``: learn online;
    ``alpha``/``warmup``/``clip``: see ``Calibration``; ``shared_copies``: the extra-work
    charge is divided by 1 + the readers of the prefix it copies (``Residency.readers``);
    ``copy_benefit``: weight of a copy's benefit to the prefix's readers (0: off);
    ``benefit_after_warmup``: that benefit counts only once calibration's warm-up has
    ended (before it, the benefit had tipped 5 of the vLLM pair's 7 warm-up copies);
    ``benefit_trust``: after warm-up it counts times the model's trust,
    ``Calibration.trust()`` (a copy on the vLLM pair one reply after warm-up, bound 1.26
    of 1.39, was the benefit's);
    ``calibration_rate``: replies per second per replica that teach calibration, beyond
    which one in every k does (``Stride``; 0: every reply); ``split_tolerance``: a reply
    whose engine-reported cached share of the prompt is further than this (plus one
    index block's share) from the estimate's teaches nothing; ``returning``: weight of
    the sessions between turns back during a placement's service (0: off); ``anchored``:
    ties of a prompt no candidate holds go by its prefix's order (``RequestView.anchor``);
    ``batching``: a request queued behind others of ours has its own calibrated fixed
    term (``Calibration``'s ``queued_fixed`` factor: an engine that batches waiting
    prompts); off, one fixed factor serves both; ``queued_bound``: a decision charges a
    queued request at most the unqueued fixed factor (``Calibration``, "Bounded for
    decisions"); ``tie_work``: among ties, those adding
    no work beyond the least win first; ``new_balance_s``: ties of a prompt no candidate
    holds count the readers expected of the new prefixes placed lately, then the service,
    decayed with this time constant (0: off, the queues then the session's hash order);
    ``untrusted_ties``: the tie margin grows by ``Calibration.error_bound()`` (no evidence:
    the worst error) instead of ``error()`` (no evidence: none); ``noise``: a reply's log
    scatter around a right model, by which calibration weighs its prior against each
    reply (``Calibration``; 1: unit noise, the earlier fit); ``sojourn_arrivals_s``: a
    router that has seen no other router's requests counts as queued behind a placement
    at most the arrivals expected during its wait and service (Little's law: the
    replica's dispatch rate, ``policies.dispatch_rate``, decayed with this time constant;
    0: off, the queue's length as is); ``cheap_copy``: a placement whose extra work (a
    copy or a recompute, beyond the least) is at most this times the mean observed service
    time is tied with the best when its score less that work's charge is, and among ties
    is put behind the others only by the queues (``tie_work`` puts a copy behind them all,
    ``_tie_key``): where a recompute costs less than a service,
    balance by count buys more than keeping each prefix in one place (0: off; before any
    reply: off)."""

    prior: CostParams = field(default_factory=lambda: STUDY_PRIOR)
    work_weight: float = 1.0
    load_aware_work: bool = True
    stay_margin: float = 0.15
    stay_margin_s: float = 0.0
    tie_margin: float = 0.1
    distrust: float = 1.0
    calibrate: bool = True
    alpha: float = 0.2
    warmup: int = 3
    clip: float = 4.0
    shared_copies: bool = True
    copy_benefit: float = 1.0
    benefit_after_warmup: bool = True
    benefit_trust: bool = True
    calibration_rate: float = 100.0
    split_tolerance: float = 0.1
    returning: float = 1.0
    anchored: bool = True
    batching: bool = True
    queued_bound: bool = True
    tie_work: bool = True
    new_balance_s: float = 60.0
    untrusted_ties: bool = True
    noise: float = 0.3
    sojourn_arrivals_s: float = 10.0
    cheap_copy: float = 0.0


@dataclass(slots=True)
class _Dispatch:
    """A dispatched request until its first token: the estimate it was sent on; ``behind``:
    others of ours were still pending on its replica; ``foreign``: the engine held other
    routers' requests (their time is in its service time, so it teaches calibration
    nothing, ``observe``)."""

    estimate: Estimate
    behind: bool
    foreign: bool


@dataclass(slots=True)
class _Sample:
    """A first token's lesson for calibration, held until the reply's end brings the
    engine's own count of cached tokens (``_learn``)."""

    estimate: Estimate
    service: float
    queued: bool


@dataclass(slots=True)
class _Memo:
    """``choose``'s estimates for the ``dispatched`` that follows it, valid for the same
    request, time and state ``version``; ``foreign``: the candidates whose engine held
    other routers' requests."""

    request_id: str
    now: float
    version: int
    estimates: dict[str, Estimate]
    foreign: set[str]
    scores: dict[str, float]


class Locality(BasePolicy):
    name: ClassVar[str] = "locality"
    config_cls: ClassVar[type[LocalityConfig]] = LocalityConfig

    def __init__(self, config: LocalityConfig | None = None) -> None:
        self.config = config or LocalityConfig()
        c = self.config
        self.calibration = Calibration(alpha=c.alpha, warmup=c.warmup, clip=c.clip,
                                       batching=c.batching, queued_bound=c.queued_bound,
                                       noise=c.noise)
        self._queues: dict[str, FifoQueue] = {}
        self._dispatches: dict[str, _Dispatch] = {}  # until observed at its first token
        self._service_mean: dict[str, float] = {}
        self._strides: dict[str, Stride] = {}
        self._samples: dict[str, _Sample] = {}  # from first token until the reply's end
        self.unexplained = 0  # samples dropped: the engine's cached share was not believed
        self._sessions = SessionLog()
        self._returning = Returning()
        self._memo: _Memo | None = None
        self._new = NewPrefixes(c.new_balance_s) if c.new_balance_s > 0 else None
        self._rates = DispatchRate(c.sojourn_arrivals_s) if c.sojourn_arrivals_s > 0 else None
        self._shared = False  # another router's requests seen on an engine (``dispatched``)
        self._copies = CopyLog()
        # EWMA (step 0.2) of |log(observed / predicted)| first token of requests sent
        # behind our own queue, on an engine holding no other router's requests
        # (``_queued_miss``): for ``GET /policy`` and the copies logged, beside the
        # running error of services; ties sized by it were tried and not kept
        # (docs/locality.md, "Ties sized by the error behind our queue")
        self.queued_error = 0.0
        self._version = 0  # bumped by every state change: a memo of another state is stale

    # -- prediction -------------------------------------------------------------------
    def estimate(self, request: RequestView, replica: ReplicaView) -> Estimate:
        """The cost model's prediction for ``request`` on ``replica`` (module docstring)."""
        return self._estimate(request, replica.id, replica.others_waiting, {},
                              self._sessions.last.get(request.session))

    def _estimate(self, request: RequestView, rid: str, others_waiting: float,
                  terms_of: dict[tuple[int, int, int], Terms],
                  last: tuple[str, int, str] | None) -> Estimate:
        """``others_waiting``: ``ReplicaView.others_waiting``; ``terms_of``: the prior's
        terms by token split, shared by the replicas of one decision (most hold
        the same prefix: none of it, or all of it via the pool); ``last``: the session's
        last dispatch (``SessionLog.last``), read once per decision. (It runs for every
        candidate of every request: plain conditionals where ``max`` would be a call.)"""
        res = request.residency
        bt = res.block_tokens
        gpu = res.gpu.get(rid, 0) * bt
        if last is not None and last[0] == rid and last[1] > gpu:  # its prompt in flight there
            gpu = last[1]
        split = split_tokens(request.prompt_tokens, gpu, res.pool * bt)
        terms = terms_of.get(split)
        if terms is None:
            gpu, load, new = split
            terms = terms_of[split] = self.config.prior.terms(gpu + load, new, load)
        queue = self._queues.get(rid)
        if queue is None:
            load_s, prefill_s = self.calibration.predict(rid, terms, False)
            wait = 0.0
        else:
            # Behind others of ours there, it shares a batched engine's steps (``queued_fixed``).
            load_s, prefill_s = self.calibration.predict(rid, terms, bool(queue.pending))
            wait = queue.wait(request.now)
        if others_waiting > 0:
            wait += others_waiting * self._service_mean.get(rid, 0.0)
        return Estimate(rid, wait, load_s, prefill_s, *split)

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = self.candidates(request, replicas)
        if not request.generates:
            return self._balanced(request, candidates)
        terms_of: dict[tuple[int, int, int], Terms] = {}
        estimates: dict[str, Estimate] = {}
        # ``dispatched`` follows at once with the same request and state: it reuses these,
        # and which replicas hold requests that are not this router's (below).
        foreign: set[str] = set()
        last = self._sessions.last.get(request.session)
        for r in candidates:
            # ``ReplicaView.others`` / ``others_waiting``, read only where the engine has any
            # requests (a property call each, for every candidate of every request).
            others = r.others if r.running or r.waiting else 0.0
            estimates[r.id] = self._estimate(request, r.id, min(r.waiting, others), terms_of, last)
            if others > 0:
                foreign.add(r.id)
        work = self._work(terms_of)
        scores = self._scores(request, estimates, work, shared=self._shared or bool(foreign))
        self._memo = _Memo(request.request_id, request.now, self._version, estimates, foreign,
                           scores)
        low = min(scores.values())
        # Scores within tie_margin of the best are not told apart by a model made of
        # estimates: among them the fewest of our requests queued, then in flight (not
        # where other routers send too: a session new to us may be theirs, and the hash
        # order is the placement all routers agree on), then the session's rendezvous
        # order (``min`` is stable), never one replica's edge.
        cal = self.calibration
        error = self.config.distrust * cal.error()
        # Before the model has shown its error it cannot tell candidates apart: the ties
        # widen to the worst error it accepts and narrow as replies show the real one.
        tie_error = (self.config.distrust * cal.error_bound() if self.config.untrusted_ties
                     else error)
        bound = low * (1 + self.config.tie_margin + tie_error)
        # Copies cheaper than a service are tied on their score without their work
        # (``cheap_copy``).
        cheap = (self._cheap(request, estimates, work) if self.config.cheap_copy > 0
                 else None)
        if cheap:
            tied = [r for r in candidates if scores[r.id] - cheap.get(r.id, 0.0) <= bound]
        else:
            tied = [r for r in candidates if scores[r.id] <= bound]
        if len(tied) > 1:
            # A prompt no candidate holds any of (that we know) goes by its anchor's order,
            # not its session's: another router may be computing that prefix right now,
            # and the anchor's order is where every router sends it.
            cold = all(e.gpu_tokens == 0 and e.pool_tokens == 0 for e in estimates.values())
            anchored = self.config.anchored and request.anchor != 0 and cold  # 0: too short
            key = f"#{request.anchor}" if anchored else request.session
            tied = rendezvous_rank(key, tied)
            adds = self._adds_work(request, estimates, work)
            # A cheap copy waits for the queues: taken where it has fewer of ours queued,
            # never where the holder has as few (an idle holder's hit costs nothing).
            cheap_adds = adds.intersection(cheap) if cheap else set()
            if cheap_adds:
                adds = adds.difference(cheap_adds)
            # A prompt nobody holds goes where the fewest requests are committed, its
            # readers to come counted (``policies.new_prefixes``, ``new_balance_s``).
            fresh = self._new is not None and not foreign and cold and not anchored
            best = min(tied, key=lambda r: self._tie_key(r, adds, cheap_adds, foreign, fresh,
                                                         request.now)).id
        else:
            best = tied[0].id
        stay = last[0] if last is not None else request.last_replica
        # Hysteresis keeps a conversation where its history is; copies of one opening sent
        # by many clients at once are no conversation, and stickiness herded them onto one
        # replica (97 % of a benchmark's identical requests): the score alone places them.
        if stay in estimates and not self._sessions.repeats(request.session,
                                                            request.prompt_tokens):
            kept = scores[stay]
            # The error defends only what keeping it is known to save: the share of the
            # prompt its GPU holds beyond the best's.
            ahead = max(0, estimates[stay].gpu_tokens - estimates[best].gpu_tokens)
            margin = self.config.stay_margin + error * min(
                1.0, ahead / max(1, request.prompt_tokens))
            if kept - scores[best] <= margin * kept + self.config.stay_margin_s:
                return Decision(stay, "sticky", estimates[stay].ttft_s)
        chosen = estimates[best]
        return Decision(best, self._reason(request, chosen, estimates), chosen.ttft_s)

    def _balanced(self, request: RequestView, candidates: list[ReplicaView]) -> Decision:
        """A request the cost model does not describe (``RequestView.generates`` false:
        ``/tokenize``, embeddings, ...): the fewest of ours queued, then in flight, then the
        session's rendezvous order. Nothing is learnt from it (``dispatched``, ``observe``):
        vLLM's own benchmark client sent 484 ``/tokenize`` calls through the router in one
        run, and their replies, a few milliseconds each, taught calibration as prefills of
        their prompts and parked their one-off sessions as between turns."""
        ranked = rendezvous_rank(request.session, candidates)
        return Decision(min(ranked, key=lambda r: (self._pending(r.id), r.in_flight)).id,
                        "balanced")

    def _work(self, terms_of: dict[tuple[int, int, int], Terms]
              ) -> tuple[dict[tuple[int, int, int], float], float] | None:
        """The fleet's work per token split (replicas holding the same prefix share one)
        and the least of them; None for one split (the common case: no placement adds
        work beyond another's)."""
        if len(terms_of) < 2:
            return None
        work_of = {split: self.calibration.work(terms) for split, terms in terms_of.items()}
        return work_of, min(work_of.values())

    def _scores(self, request: RequestView, estimates: dict[str, Estimate],
                work: tuple[dict[tuple[int, int, int], float], float] | None, *,
                shared: bool) -> dict[str, float]:
        """Each candidate's score (the module docstring's formula); ``work``: ``_work``'s;
        ``shared``: another router's requests seen on an engine, now or before."""
        w = self.config.work_weight
        readers = request.residency.readers
        benefit_weight = self._benefit_weight() if readers > 0 else 0.0
        # Extra work that copies a prefix others are reading right now is shared with them.
        extra_w = self._extra_weight(request)
        mean_service = self._mean_service()
        # A session back during the service waits half of it. A prefix others read now is
        # priced by what a copy is worth to them (``copy_benefit``), not by this charge.
        back = 0.0 if readers else self.config.returning / 2
        if self._returning.gap <= 0:  # no session has come back yet: none expected
            back = 0.0
        scores: dict[str, float] = {}
        # Little's law, for a router alone in front of its engines (another's arrivals are
        # not in our rate): of those queued now, only the arrivals during the placement's
        # wait and service will queue behind it; a burst's queue at light load is gone by
        # the next arrival (``sojourn_arrivals_s``).
        rates = None if shared else self._rates
        for rid, e in estimates.items():
            service = e.load_s + e.prefill_s
            queued = e.wait_s / mean_service if mean_service > 0 else 0.0
            if rates is not None and queued > 0:
                queued = min(queued, rates.rate(rid, request.now) * (e.wait_s + service))
            if back > 0:  # sessions parked there that come back during it (``returning``)
                queued += back * self._returning.expected(rid, service, request.session)
            score = e.wait_s + service
            if work is not None:
                work_of, least_work = work
                score += extra_w * (work_of[e.gpu_tokens, e.pool_tokens, e.new_tokens]
                                    - least_work)
            scores[rid] = score + w * queued * service
        if benefit_weight > 0:  # serves others too
            copy_benefit.apply(scores, estimates, readers,
                               weight=benefit_weight, work_weight=w,
                               mean_service=mean_service)
        return scores

    def _cheap(self, request: RequestView, estimates: dict[str, Estimate],
               work: tuple[dict[tuple[int, int, int], float], float] | None
               ) -> dict[str, float]:
        """The candidates whose extra work is at most ``cheap_copy`` x the mean observed
        service time, each with the charge that work adds to its score: the work itself
        in its own service and ``work_weight`` (shared among the prefix's readers, as
        ``_scores`` shares it) beside it; none before any reply (no service observed) or
        for a prompt shorter than one index block."""
        # A prompt shorter than an index block has no prefix to copy: its extra work is
        # only the session log's guess of its own prompt in flight (``_estimate``), and a
        # benchmark's one request repeated over engines faster than the router (the test
        # ``test_identical_engines_faster_than_the_router_share_its_traffic``) swung to
        # 78 % on one with that counted as a cheap copy.
        if work is None or not self._service_mean or request.residency.chain_blocks == 0:
            return {}
        work_of, least = work
        limit = self.config.cheap_copy * self._observed_service()
        w = self._extra_weight(request)
        out: dict[str, float] = {}
        for rid, e in estimates.items():
            excess = work_of[e.gpu_tokens, e.pool_tokens, e.new_tokens] - least
            if 0 < excess <= limit:
                out[rid] = (1 + w) * excess
        return out

    def _benefit_weight(self) -> float:
        """The weight a copy's benefit counts with: ``copy_benefit``, none until
        calibration's warm-up has ended (``benefit_after_warmup``), then times the model's
        trust, ``Calibration.trust()`` (``benefit_trust``): the benefit is the
        model's prediction of the readers' waits times their count, so the model's error
        is multiplied by the readers (with no replies yet, the prior's own ratios)."""
        c = self.calibration
        weight = self.config.copy_benefit
        if not self.config.calibrate or weight <= 0:
            return weight
        if self.config.benefit_after_warmup and c.observations <= c.warmup:
            return 0.0
        if self.config.benefit_trust:
            weight *= c.trust()
        return weight

    def _adds_work(self, request: RequestView, estimates: dict[str, Estimate],
                   work: tuple[dict[tuple[int, int, int], float], float] | None) -> set[str]:
        """The candidates whose placement adds work beyond the least (``tie_work``): a copy
        or a recompute; none for copies of one opening (no conversation's replica)."""
        if (not self.config.tie_work or work is None
                or self._sessions.repeats(request.session, request.prompt_tokens)):
            return set()
        work_of, least = work
        return {rid for rid, e in estimates.items()
                if work_of[e.gpu_tokens, e.pool_tokens, e.new_tokens] > least}

    def _tie_key(self, replica: ReplicaView, adds: set[str], cheap: set[str],
                 foreign: set[str], fresh: bool, now: float
                 ) -> tuple[bool, float, bool, int, float]:
        """The order of tied candidates (``choose``): adding no work beyond the least
        (``cheap`` copies, ``cheap_copy``, excepted); the fewest of our requests queued,
        for a prompt nobody holds (``fresh``) plus the readers expected of the new
        prefixes placed lately (``NewPrefixes.committed``); then not a cheap copy; the
        fewest in flight (not where other routers send too); for a fresh prompt the least
        work placed lately."""
        queued = self._pending(replica.id)
        new = self._new
        rid = replica.id
        if not fresh or new is None:
            return (rid in adds, queued, rid in cheap, 0 if foreign else replica.in_flight, 0.0)
        return (rid in adds, new.committed(rid, queued, now), rid in cheap, replica.in_flight,
                new.of(rid, now)[1])

    def _pending(self, replica: str) -> int:
        queue = self._queues.get(replica)
        return len(queue.pending) if queue is not None else 0

    def _mean_service(self) -> float:
        """Mean observed service time over replicas (0: unknown, or the charge is off)."""
        if not self.config.load_aware_work or not self._service_mean:
            return 0.0
        return self._observed_service()

    def _observed_service(self) -> float:
        """Mean observed service time over replicas (some replica has answered)."""
        return sum(self._service_mean.values()) / len(self._service_mean)

    def _extra_weight(self, request: RequestView) -> float:
        """Seconds of score per second of extra work a placement of ``request`` causes:
        ``work_weight``, shared among the readers of the prefix it copies
        (``shared_copies``)."""
        w = self.config.work_weight
        return w / (1 + request.residency.readers) if self.config.shared_copies else w

    @staticmethod
    def _reason(request: RequestView, chosen: Estimate, estimates: dict[str, Estimate]) -> str:
        if request.exclude or (request.last_replica is not None
                               and request.last_replica not in estimates):
            return "failover"
        cached = chosen.gpu_tokens + chosen.pool_tokens
        for e in estimates.values():  # a loop, not ``max`` over a generator: every request
            if e.gpu_tokens + e.pool_tokens > cached:
                return "balance"
        if chosen.pool_tokens > 0:
            return "pool-hit"
        if chosen.gpu_tokens > 0:
            return "gpu-hit"
        return "miss"

    # -- state changes ------------------------------------------------------------------
    def dispatched(self, request: RequestView, decision: Decision) -> None:
        if not request.generates:  # ``_balanced``: no model of it, no state
            return
        memo = self._memo
        if (memo is not None and memo.request_id == request.request_id
                and memo.now == request.now and memo.version == self._version
                and decision.replica in memo.estimates):
            est = memo.estimates[decision.replica]
            foreign = decision.replica in memo.foreign
            self._shared = self._shared or bool(memo.foreign)
            if decision.reason == "balance":  # a copy: kept for ``GET /policy`` (``CopyLog``)
                cal = self.calibration
                self._copies.add(request.request_id, request.now, decision.replica,
                                 memo.estimates, memo.scores,
                                 {rid: self._pending(rid) for rid in memo.estimates},
                                 cal.error(), cal.error_bound(), self.queued_error,
                                 cal.factors())
        else:  # a decision not made by this ``choose`` (a split's arm, a test)
            est = self._estimate(request, decision.replica, 0.0, {},
                                 self._sessions.last.get(request.session))
            foreign = False
        self._memo = None
        self._version += 1
        if self.config.returning > 0:  # off: no bookkeeping either
            self._returning.expire(request.now)
            self._returning.returned(request.session, request.now)
        queue = self._queues.get(decision.replica)
        if queue is None:
            queue = self._queues[decision.replica] = FifoQueue()
        self._dispatches[request.request_id] = _Dispatch(est, bool(queue.pending), foreign)
        queue.push(request.request_id, request.now, est.load_s + est.prefill_s)
        if self._rates is not None:
            self._rates.add(decision.replica, request.now)
        if self._new is not None:
            res = request.residency
            self._new.add(decision.replica, request.now, blocks=res.chain_blocks,
                          held=res.pool > 0 or any(res.gpu.values()),
                          work=est.load_s + est.prefill_s)
        self._sessions.sent(request.session, decision.replica, request.prompt_tokens,
                            request.request_id)

    def observe(self, outcome: Outcome) -> None:
        if not outcome.request.generates:
            return
        self._version += 1
        rid = outcome.request.request_id
        if outcome.phase == "done" or not outcome.ok:
            session = outcome.request.session
            self._sessions.finished(session, rid)
            if (self.config.returning > 0 and outcome.ok
                    and not self._sessions.flying(session)):  # between turns
                self._returning.ended(session, outcome.decision.replica, outcome.request.residency,
                                      outcome.request.now if outcome.at is None else outcome.at)
        dispatch = self._dispatches.pop(rid, None)
        if dispatch is None:  # already observed at its first token
            sample = self._samples.pop(rid, None)
            if sample is not None and outcome.ok:
                self._learn(sample, outcome)
            return
        est, behind, foreign = dispatch.estimate, dispatch.behind, dispatch.foreign
        self._copies.observed(rid, outcome.ttft_s if outcome.ok else None)
        if behind and not foreign and outcome.ok and outcome.ttft_s:
            self._queued_miss(est.ttft_s, outcome.ttft_s)
        queue = self._queues[outcome.decision.replica]
        sent, _ = queue.pop(rid, (outcome.request.now, 0.0))
        if not outcome.ok or outcome.ttft_s is None:
            return
        at = outcome.at if outcome.at is not None else sent + outcome.ttft_s
        if outcome.phase == "done" and outcome.total_s is not None:
            at -= outcome.total_s - outcome.ttft_s  # the reply's first byte, not its end
        last = queue.last_first_token
        started = sent if sent > last else last
        if at > last:
            queue.last_first_token = at
        service = at - started
        queued = behind or started > sent
        if service > 0:
            # Served among other routers' requests, its time holds theirs: its own is the
            # prediction (the mean turns their waiting count into seconds).
            own = est.load_s + est.prefill_s if foreign else service
            prev = self._service_mean.get(est.replica)
            self._service_mean[est.replica] = (own if prev is None
                                               else 0.8 * prev + 0.2 * own)
        elif not queued:
            return
        if self.config.calibrate and not foreign and self._teaches(est.replica, at):
            sample = _Sample(est, max(0.0, service), queued)
            if outcome.phase == "done":
                self._learn(sample, outcome)
            else:  # the engine's count of cached tokens, if any, comes with the reply's end
                self._samples[rid] = sample

    def _learn(self, sample: _Sample, outcome: Outcome) -> None:
        """Fold ``sample`` into calibration, unless the engine reports a cached share of
        the prompt further than ``split_tolerance`` plus one index block's share from the
        one its estimate assumed: the index did not know what that replica held (another
        router placed it, or it was evicted), and its time would teach the model wrong
        hardware. (The index counts whole blocks of ``block_tokens``, the engine its own
        smaller ones: a 1,600-token prompt hitting 1,568 cached tokens is 5 blocks of 256,
        0.8 of it, to the index and 0.98 to vLLM.)"""
        est = sample.estimate
        total = est.gpu_tokens + est.pool_tokens + est.new_tokens
        if outcome.cached_tokens is not None and outcome.prompt_tokens and total > 0:
            reported = outcome.cached_tokens / outcome.prompt_tokens
            believed = (est.gpu_tokens + est.pool_tokens) / total
            slack = self.config.split_tolerance + outcome.request.residency.block_tokens / total
            if abs(reported - believed) > slack:
                self.unexplained += 1
                return
        terms = self.config.prior.terms(est.gpu_tokens + est.pool_tokens, est.new_tokens,
                                        est.pool_tokens)
        # A queued request's own time is the engine's scheduler's to split (batched
        # prefills answer together); calibration counts its run's total instead.
        self.calibration.update(est.replica, terms, sample.service, queued=sample.queued)

    def _queued_miss(self, predicted_s: float, observed_s: float) -> None:
        """Fold one first token sent behind our queue into ``queued_error`` (its log
        miss clipped at ``log(clip)``, as calibration clips its own)."""
        if predicted_s > 0:
            miss = min(abs(math.log(observed_s / predicted_s)), math.log(self.config.clip))
            self.queued_error += 0.2 * (miss - self.queued_error)

    def _teaches(self, replica: str, at: float) -> bool:
        """Whether this reply on ``replica`` teaches calibration (``Stride``)."""
        if self.config.calibration_rate <= 0:
            return True
        stride = self._strides.get(replica)
        if stride is None:
            stride = self._strides[replica] = Stride(self.config.calibration_rate)
        return stride.take(at)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "compiled": COMPILED,
            "config": asdict(self.config),
            "calibration": self.calibration.as_json(),
            "mean_service_s": dict(self._service_mean),
            "queued": {rid: len(q.pending) for rid, q in self._queues.items()},
            "unexplained_replies": self.unexplained,
            "queued_error": self.queued_error,
            "copy_benefit_weight": self._benefit_weight(),
            "returning": self._returning.as_json(),
            "new_prefixes": None if self._new is None else self._new.as_json(),
            "copies": self._copies.as_json(),
        }
