"""``locality``: send each request where its predicted time to first token is lowest.

For every healthy candidate replica ``r`` the cost model (``policies.cost``) predicts

    ttft(r) = wait(r) + pool load of the pool prefix beyond r's GPU prefix
                      + prefill of the rest (superlinear in context)

from the residency the router looked up (r's GPU prefix, the pool prefix) and the prefill
work already admitted on ``r``. The minimum wins, with hysteresis: the session's last
replica is kept unless another is predicted faster by more than ``stay_margin`` (relative)
plus ``stay_margin_s`` — a session never moves for nothing, and with no pool (or an
evicted one) moving means a full recompute, so sessions stay put as under ``fixed``.

Wait (FIFO, one prefill at a time per replica, as vLLM schedules long prefills): each
dispatched request occupies ``r`` from ``max(now, r's busy-until)`` for its predicted
service time; ``wait(r) = busy-until - now``. Entries leave on ``observe`` (first token or
failure) or when their predicted time passes, so a lost observation cannot clog a
replica. Engine-reported waiting requests beyond our own count (other routers' traffic)
add ``their count x r's mean observed service time``.

Reasons: ``sticky`` (kept on the session's replica), ``gpu-hit`` / ``pool-hit`` / ``miss``
(what the chosen replica will do), ``balance`` (the chosen replica is not the one holding
the most cached tokens: load won over locality), ``failover`` (the session's replica is
gone or failed this request).

Calibration: observed TTFTs update per-replica prefill and pool-load factors
(``Calibration``), so the prior (the study's H200 fit) adapts to the hardware or an
emulator's time scale. ``choose`` is pure: time comes from ``RequestView.now``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from policies.base import BasePolicy, Decision, Outcome, ReplicaView, RequestView
from policies.cost import STUDY_PRIOR, Calibration, CostParams, Estimate, split_tokens
from policies.hashing import rendezvous_rank


@dataclass(frozen=True, slots=True)
class LocalityConfig:
    """``stay_margin``: relative advantage another replica needs to take a session away;
    ``stay_margin_s``: the same in absolute seconds (added); ``calibrate``: learn online;
    ``alpha``/``warmup``/``clip``: see ``Calibration``."""

    prior: CostParams = field(default_factory=lambda: STUDY_PRIOR)
    stay_margin: float = 0.15
    stay_margin_s: float = 0.0
    calibrate: bool = True
    alpha: float = 0.2
    warmup: int = 3
    clip: float = 4.0


@dataclass(slots=True)
class _Busy:
    """Predicted prefill occupancy of one replica: request id -> (start, end)."""

    slots: dict[str, tuple[float, float]] = field(default_factory=dict)

    def until(self, now: float) -> float:
        return max((end for _, end in self.slots.values()), default=now)

    def active(self, now: float) -> int:
        return sum(1 for _, end in self.slots.values() if end > now)

    def prune(self, now: float) -> None:
        for rid in [rid for rid, (_, end) in self.slots.items() if end <= now]:
            del self.slots[rid]


class Locality(BasePolicy):
    name: ClassVar[str] = "locality"

    def __init__(self, config: LocalityConfig | None = None) -> None:
        self.config = config or LocalityConfig()
        c = self.config
        self.calibration = Calibration(alpha=c.alpha, warmup=c.warmup, clip=c.clip)
        self._busy: dict[str, _Busy] = {}
        self._chosen: dict[str, Estimate] = {}
        self._service_mean: dict[str, float] = {}

    # -- prediction -------------------------------------------------------------------
    def estimate(self, request: RequestView, replica: ReplicaView) -> Estimate:
        res = request.residency
        bt = res.block_tokens
        gpu, load, new = split_tokens(request.prompt_tokens, res.gpu_blocks(replica.id) * bt,
                                      res.pool * bt)
        prior = self.config.prior
        busy = self._busy.get(replica.id)
        wait = 0.0
        own = 0
        if busy is not None:
            wait = max(0.0, busy.until(request.now) - request.now)
            own = busy.active(request.now)
        others = max(0.0, replica.waiting - own)
        wait += others * self._service_mean.get(replica.id, 0.0)
        return Estimate(
            replica=replica.id,
            wait_s=wait,
            load_s=prior.pool_load_s(load) * self.calibration.load_scale(replica.id),
            prefill_s=prior.prefill_s(gpu + load, new) * self.calibration.prefill_scale(replica.id),
            gpu_tokens=gpu,
            pool_tokens=load,
            new_tokens=new,
        )

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = rendezvous_rank(request.session, self.candidates(request, replicas))
        estimates = {r.id: self.estimate(request, r) for r in candidates}
        best = min(candidates, key=lambda r: estimates[r.id].ttft_s)
        stay = request.last_replica
        if stay in estimates:
            kept = estimates[stay]
            beaten_by = kept.ttft_s - estimates[best.id].ttft_s
            if beaten_by <= self.config.stay_margin * kept.ttft_s + self.config.stay_margin_s:
                return Decision(stay, "sticky", kept.ttft_s)
        chosen = estimates[best.id]
        return Decision(best.id, self._reason(request, chosen, estimates), chosen.ttft_s)

    @staticmethod
    def _reason(request: RequestView, chosen: Estimate, estimates: dict[str, Estimate]) -> str:
        if request.exclude or (request.last_replica is not None
                               and request.last_replica not in estimates):
            return "failover"
        most_cached = max(e.gpu_tokens + e.pool_tokens for e in estimates.values())
        if chosen.gpu_tokens + chosen.pool_tokens < most_cached:
            return "balance"
        if chosen.pool_tokens > 0:
            return "pool-hit"
        if chosen.gpu_tokens > 0:
            return "gpu-hit"
        return "miss"

    # -- state changes ------------------------------------------------------------------
    def dispatched(self, request: RequestView, decision: Decision) -> None:
        replica = ReplicaView(id=decision.replica, url="")
        est = self.estimate(request, replica) if decision.replica else None
        if est is None:
            return
        busy = self._busy.setdefault(decision.replica, _Busy())
        busy.prune(request.now)
        start = max(request.now, busy.until(request.now))
        busy.slots[request.request_id] = (start, start + est.load_s + est.prefill_s)
        self._chosen[request.request_id] = est

    def observe(self, outcome: Outcome) -> None:
        rid = outcome.request.request_id
        replica = outcome.decision.replica
        est = self._chosen.pop(rid, None)
        busy = self._busy.get(replica)
        if busy is not None:
            busy.slots.pop(rid, None)
        if est is None or not outcome.ok or outcome.ttft_s is None:
            return
        service = max(0.0, outcome.ttft_s - est.wait_s)
        prev = self._service_mean.get(replica)
        self._service_mean[replica] = service if prev is None else 0.8 * prev + 0.2 * service
        if self.config.calibrate:
            self.calibration.update(est, outcome.ttft_s)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "config": asdict(self.config),
            "calibration": self.calibration.as_json(),
            "mean_service_s": dict(self._service_mean),
            "predicted_busy": {rid: len(b.slots) for rid, b in self._busy.items()},
        }
