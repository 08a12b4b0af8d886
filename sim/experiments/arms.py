"""Experiment plumbing: arms (policy x pool x residency source), runs, results, progress.

A ``SimArm`` is one policy (a name, or ``NAME@KEY=VALUE@...`` with options, as in
``--policy`` of ``lmroute serve``), the pool on or off, and the residency source: the
router's index (the real thing) or, with ``oracle``, the models' caches (an upper bound,
labelled ``NAME+oracle``). ``NAME+oracle-prior`` hands the policy the profile's own timings
as its cost prior (``oracle_prior``): physics and beliefs share a source only there, so an
experiment says so by name and reports it beside the honest run, whose prior is the
policy's own (``locality``: the study fit, or ``@prior=PATH``).

Every arm of a comparison replays the same workload: the workload factory is called
with a fresh ``random.Random(seed)`` per arm (common random numbers), so differences come
from routing, not from sampling, and measurements pair one to one.

``Result`` is the JSON contract: ``scenario``, ``params``, ``rows`` (flat records with at
least policy, pool, n and the TTFT quantiles), and for ``study`` ``comparisons``.
Progress is reported through a ``Progress`` hook; the CLI passes a rich progress bar.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from policies.base import Policy
from policies.cost import CostParams
from policies.registry import create, names
from policies.split import parse_policy_ref
from sim.des.cluster import Cluster
from sim.des.simulation import Record, Run
from sim.des.workload import Workload
from sim.replica.profiles import Profile

ORACLE_SUFFIX = "+oracle"
ORACLE_PRIOR_SUFFIX = "+oracle-prior"


@dataclass(frozen=True, slots=True)
class SimArm:
    policy: str
    pool_on: bool
    oracle: bool = False
    oracle_prior: bool = False

    @property
    def label(self) -> str:
        return (self.policy + (ORACLE_PRIOR_SUFFIX if self.oracle_prior else "")
                + (ORACLE_SUFFIX if self.oracle else ""))

    @property
    def pool(self) -> str:
        return "on" if self.pool_on else "off"


def oracle_prior(profile: Profile) -> CostParams:
    """The profile's timings as a cost prior: what a policy would believe if it knew the physics."""
    fields = {**dataclasses.asdict(profile), "name": f"{profile.name} (oracle)"}
    return CostParams.from_fields(fields, source="profile")


def parse_policy(text: str) -> SimArm:
    """``NAME[@K=V...][+oracle-prior][+oracle]`` -> a pool-less ``SimArm``; bad names raise."""
    oracle = text.endswith(ORACLE_SUFFIX) and not text.endswith(ORACLE_PRIOR_SUFFIX)
    rest = text[: -len(ORACLE_SUFFIX)] if oracle else text
    knows = rest.endswith(ORACLE_PRIOR_SUFFIX)
    ref = rest[: -len(ORACLE_PRIOR_SUFFIX)] if knows else rest
    name, options = parse_policy_ref(ref)
    create(name, options)  # raises UnknownPolicy / BadPolicyOptions, naming what is known
    return SimArm(ref, False, oracle, knows)


def arms(policies: Sequence[str] | None, pools: Iterable[bool] = (False, True),
         oracle: bool = False) -> list[SimArm]:
    """Every policy (default: all registered) under every pool setting; ``oracle`` adds twins."""
    chosen = [parse_policy(p) for p in (policies or names())]
    if oracle:
        chosen += [replace(a, oracle=True) for a in chosen if not a.oracle]
    return [replace(a, pool_on=pool) for pool in pools for a in chosen]


def make_policy(arm: SimArm, profile: Profile) -> Policy:
    """A fresh policy for ``arm``; its prior is its own unless the arm is ``+oracle-prior``."""
    name, options = parse_policy_ref(arm.policy)
    if arm.oracle_prior:
        options["prior"] = oracle_prior(profile)
    return create(name, options)


class Progress(Protocol):
    def start(self, total: int, what: str) -> None: ...

    def advance(self, label: str) -> None: ...


class NoProgress:
    def start(self, total: int, what: str) -> None:
        return None

    def advance(self, label: str) -> None:
        return None


@dataclass(slots=True)
class Result:
    scenario: str
    params: dict[str, Any]
    rows: list[dict[str, Any]]
    comparisons: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scenario": self.scenario, "params": self.params, "rows": self.rows}
        if self.comparisons is not None:
            out["comparisons"] = self.comparisons
        out.update(self.extra)
        return out


@dataclass(frozen=True, slots=True)
class ArmRecords:
    """Records of one ``SimArm`` and what it cost to simulate (process CPU seconds: no wall clock)."""

    arm: SimArm
    records: list[Record]
    events: int
    cpu_s: float


def run_arm(profile: Profile, replicas: int, arm: SimArm,
            workload: Callable[[random.Random], Workload], seed: int,
            pool_bytes: int | None = None, routers: int = 1, scrape_interval_s: float = 0.0,
            balancer: str = "random",
            replica_profiles: Mapping[str, Profile] | None = None,
            shared_index: bool = False) -> ArmRecords:
    """A fresh cluster and policies; the workload built from ``random.Random(seed)``.

    ``routers``: router processes behind a plain load balancer (``balancer``: ``random`` or
    ``round-robin``, no session affinity), each with its own fresh policy from
    ``make_policy``; ``scrape_interval_s``: how stale their engine metrics are (0: fresh).
    ``replica_profiles``: replicas whose physics differ from ``profile`` (a heterogeneous
    fleet). ``shared_index``: the routers share one index (Redis). See ``sim.des.cluster``.
    The balancer draws from its own ``random.Random`` seeded from
    ``seed``, apart from the workload's, so every arm still replays the same workload.
    """
    cluster = Cluster(profile, replicas, pool_on=arm.pool_on, pool_bytes=pool_bytes,
                      oracle=arm.oracle, routers=routers, scrape_interval_s=scrape_interval_s,
                      balancer=balancer, rng=random.Random(f"balancer/{seed}"),
                      replica_profiles=replica_profiles, shared_index=shared_index)
    load = workload(random.Random(seed))
    policies = [make_policy(arm, profile) for _ in range(routers)]
    # CPU time of this process: a measure of the simulator's own cost, not an input to it.
    t0 = time.process_time()
    records = Run(cluster, policies, load, arm.label).execute()
    return ArmRecords(arm, records, cluster.loop.handled, time.process_time() - t0)


def session_totals(records: Iterable[Record]) -> dict[str, float]:
    """Per session: first arrival to last token (the study's session time)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for r in records:
        first[r.session] = min(first.get(r.session, r.arrival), r.arrival)
        last[r.session] = max(last.get(r.session, 0.0), r.arrival + r.total_s)
    return {s: last[s] - first[s] for s in first}
