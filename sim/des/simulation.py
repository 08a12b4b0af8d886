"""Policies serving one workload on a cluster: the events and the per-request record.

One policy object per router (``Cluster.routers``): each router is its own process with its
own policy state (locality's queues, calibration), fed only by the requests it routed.

Events (the request path of ``router/proxy.py``, in virtual time):

- ``Arrival``: the load balancer picks a router (``Cluster.route``); that router builds the
  ``RequestView`` (one lookup in its own index) and the ``ReplicaView`` list (its own
  in-flight counts, the engines' scraped metrics); its policy ``choose``s and is told
  ``dispatched``; then the chosen model admits the request (``ReplicaModel.admit`` plans
  its whole timeline) and the router's in-flight count rises. Schedules the
  ``Completion`` at the plan's last token.
- ``FirstToken``: that router's ``policy.observe(Outcome(phase="first_token", ttft_s))``
  at the plan's first token, as the router does on a streamed reply's first byte.
- ``Completion``: that router's in-flight count falls, its ``policy.observe(Outcome(ttft_s,
  total_s))``, it records the prefix (``SimRouter.complete``), and the workload releases
  what waited on this request (the session's next turn, which may reach another router).

TTFT is the model's first token minus the arrival: the router adds no time here (its
overhead, ~0.1 ms, is measured in benchmarks, not simulated).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policies.base import Decision, Outcome, Policy, RequestView
from sim.des.cluster import Cluster, SimRouter
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
    router: int = 0  # the router the load balancer handed the request to
    predicted_s: float | None = None  # the policy's predicted TTFT (``Decision``), if any


class Run:
    """Drives ``workload`` through the routers' policies on ``cluster``; collects the records.

    ``policy``: one ``Policy`` for a single-router cluster, or a sequence of distinct policy
    objects, one per router (``policies[i]`` serves ``cluster.routers[i]``); a policy shared
    by several routers would pool what separate processes cannot, so it is refused.
    ``label`` (default: the first policy's name, ``+oracle`` on an oracle cluster) names
    the records.
    """

    def __init__(self, cluster: Cluster, policy: Policy | Sequence[Policy], workload: Workload,
                 label: str | None = None) -> None:
        policies = list(policy) if isinstance(policy, Sequence) else [policy]
        if len(policies) != len(cluster.routers):
            raise ValueError(f"{len(policies)} policies for {len(cluster.routers)} routers: "
                             "one per router")
        if len({id(p) for p in policies}) != len(policies):
            raise ValueError("each router needs its own policy object")
        self.cluster = cluster
        self.policies = policies
        self.policy = policies[0]
        self.workload = workload
        self.label = label or (self.policy.name + ("+oracle" if cluster.oracle else ""))
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
        router = cluster.route()
        policy = run.policies[router.number]
        view = router.request_view(req, now)
        decision = policy.choose(view, router.replica_views(now))
        policy.dispatched(view, decision)
        plan = cluster.dispatch(req, decision.replica, now, router)
        return [FirstToken(plan.first_token_at, run, router, view, decision, plan),
                Completion(plan.finish_at, run, router, req, view, decision, plan)]


class FirstToken:
    __slots__ = ("decision", "plan", "router", "run", "time", "view")

    def __init__(self, time: float, run: Run, router: SimRouter, view: RequestView,
                 decision: Decision, plan: Timeline) -> None:
        self.time = time
        self.run = run
        self.router = router
        self.view = view
        self.decision = decision
        self.plan = plan

    def handle(self, now: float) -> list[Arrival]:
        policy = self.run.policies[self.router.number]
        policy.observe(Outcome(self.view, self.decision, ok=True, ttft_s=self.plan.ttft_s,
                               phase="first_token", at=now))
        return []


class Completion:
    __slots__ = ("decision", "plan", "request", "router", "run", "time", "view")

    def __init__(self, time: float, run: Run, router: SimRouter, request: SimRequest,
                 view: RequestView, decision: Decision, plan: Timeline) -> None:
        self.time = time
        self.run = run
        self.router = router
        self.request = request
        self.view = view
        self.decision = decision
        self.plan = plan

    def handle(self, now: float) -> list[Arrival]:
        run, req, plan, router = self.run, self.request, self.plan, self.router
        router.complete(req, self.decision.replica, now)
        run.policies[router.number].observe(Outcome(
            self.view, self.decision, ok=True, ttft_s=plan.ttft_s, total_s=plan.total_s, at=now,
            prompt_tokens=plan.prompt_tokens,
            cached_tokens=plan.gpu_hit_tokens + plan.pool_hit_tokens))
        run.records.append(Record(
            run.label, run.pool, req.tag, req.session, req.turn, self.decision.replica,
            self.decision.reason, plan.arrival, plan.ttft_s, plan.total_s, plan.prompt_tokens,
            plan.gpu_hit_tokens, plan.pool_hit_tokens, req.measured, router.number,
            self.decision.predicted_ttft_s))
        return run.arrivals(run.workload.after(req, now))
