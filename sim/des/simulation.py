"""One policy serving one workload on a cluster: the two events and the per-request record.

Events (the request path of ``router/proxy.py``, in virtual time):

- ``Arrival``: build the ``RequestView`` (one index lookup) and the ``ReplicaView`` list,
  ``policy.choose``, ``policy.dispatched``, then the chosen model admits the request
  (``ReplicaModel.admit`` plans its whole timeline) and the router's in-flight count
  rises. Schedules the ``Completion`` at the plan's last token.
- ``FirstToken``: ``policy.observe(Outcome(phase="first_token", ttft_s))`` at the plan's
  first token, as the router does on a streamed reply's first byte.
- ``Completion``: the in-flight count falls, ``policy.observe(Outcome(ttft_s, total_s))``,
  the router records the prefix (``Cluster.complete``), and the workload releases what
  waited on this request (the session's next turn).

TTFT is the model's first token minus the arrival: the router adds no time here (its
overhead, ~0.1 ms, is measured in benchmarks, not simulated).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from policies.base import Decision, Outcome, Policy, RequestView
from sim.des.cluster import Cluster
from sim.des.workload import SimRequest, Workload
from sim.replica.model import Timeline


@dataclass(frozen=True, slots=True)
class Record:
    """One finished request, as an experiment reports it."""

    policy: str
    pool: str
    tag: str
    session: str
    turn: int
    replica: str
    reason: str
    arrival: float
    ttft_s: float
    total_s: float
    prompt_tokens: int
    gpu_hit_tokens: int
    pool_hit_tokens: int
    measured: bool


class Run:
    """Drives ``workload`` through ``policy`` on ``cluster`` and collects the records."""

    def __init__(self, cluster: Cluster, policy: Policy, workload: Workload,
                 label: str | None = None) -> None:
        self.cluster = cluster
        self.policy = policy
        self.workload = workload
        self.label = label or (policy.name + ("+oracle" if cluster.oracle else ""))
        self.pool = "on" if cluster.pool_on else "off"
        self.records: list[Record] = []

    def arrivals(self, items: Iterable[tuple[float, SimRequest]]) -> list[Arrival]:
        return [Arrival(t, self, r) for t, r in items]

    def execute(self) -> list[Record]:
        """Release the workload at the cluster's current time and run until it drains."""
        loop = self.cluster.loop
        loop.schedule(self.arrivals(self.workload.initial(loop.now)))
        loop.run()
        return self.records


class Arrival:
    __slots__ = ("request", "run", "time")

    def __init__(self, time: float, run: Run, request: SimRequest) -> None:
        self.time = time
        self.run = run
        self.request = request

    def handle(self, now: float) -> list[FirstToken | Completion]:
        run, req = self.run, self.request
        cluster = run.cluster
        view = cluster.request_view(req, now)
        decision = run.policy.choose(view, cluster.replica_views(now))
        run.policy.dispatched(view, decision)
        plan = cluster.dispatch(req, decision.replica, now)
        return [FirstToken(plan.first_token_at, run, view, decision, plan),
                Completion(plan.finish_at, run, req, view, decision, plan)]


class FirstToken:
    __slots__ = ("decision", "plan", "run", "time", "view")

    def __init__(self, time: float, run: Run, view: RequestView, decision: Decision,
                 plan: Timeline) -> None:
        self.time = time
        self.run = run
        self.view = view
        self.decision = decision
        self.plan = plan

    def handle(self, now: float) -> list[Arrival]:
        self.run.policy.observe(Outcome(self.view, self.decision, ok=True,
                                        ttft_s=self.plan.ttft_s, phase="first_token", at=now))
        return []


class Completion:
    __slots__ = ("decision", "plan", "request", "run", "time", "view")

    def __init__(self, time: float, run: Run, request: SimRequest, view: RequestView,
                 decision: Decision, plan: Timeline) -> None:
        self.time = time
        self.run = run
        self.request = request
        self.view = view
        self.decision = decision
        self.plan = plan

    def handle(self, now: float) -> list[Arrival]:
        run, req, plan = self.run, self.request, self.plan
        run.cluster.complete(req, self.decision.replica)
        run.policy.observe(Outcome(self.view, self.decision, ok=True, ttft_s=plan.ttft_s,
                                   total_s=plan.total_s, at=now))
        run.records.append(Record(
            run.label, run.pool, req.tag, req.session, req.turn, self.decision.replica,
            self.decision.reason, plan.arrival, plan.ttft_s, plan.total_s, plan.prompt_tokens,
            plan.gpu_hit_tokens, plan.pool_hit_tokens, req.measured))
        return run.arrivals(run.workload.after(req, now))
