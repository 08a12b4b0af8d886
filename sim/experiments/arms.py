"""Experiment plumbing: arms (policy x pool x residency source), runs, results, progress.

A ``SimArm`` is one policy name, the pool on or off, and the residency source: the router's
index (the real thing) or, with ``oracle``, the models' caches (an upper bound, labelled
``NAME+oracle``). Every arm of a comparison replays the same workload: the workload
factory is called with a fresh ``random.Random(seed)`` per arm (common random numbers), so
differences come from routing, not from sampling, and measurements pair one to one.

``Result`` is the JSON contract: ``scenario``, ``params``, ``rows`` (flat records with at
least policy, pool, n and the TTFT quantiles), and for ``study`` ``comparisons``.
Progress is reported through a ``Progress`` hook; the CLI passes a rich progress bar.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.registry import create, names
from sim.des.cluster import Cluster
from sim.des.simulation import Record, Run
from sim.des.workload import Workload
from sim.replica.profiles import Profile

ORACLE_SUFFIX = "+oracle"


@dataclass(frozen=True, slots=True)
class SimArm:
    policy: str
    pool_on: bool
    oracle: bool = False

    @property
    def label(self) -> str:
        return self.policy + (ORACLE_SUFFIX if self.oracle else "")

    @property
    def pool(self) -> str:
        return "on" if self.pool_on else "off"


def parse_policy(name: str) -> tuple[str, bool]:
    """``NAME`` or ``NAME+oracle`` -> (registered name, oracle); unknown names raise."""
    oracle = name.endswith(ORACLE_SUFFIX)
    base = name[: -len(ORACLE_SUFFIX)] if oracle else name
    create(base)  # raises UnknownPolicy with the known names
    return base, oracle


def arms(policies: Sequence[str] | None, pools: Iterable[bool] = (False, True),
         oracle: bool = False) -> list[SimArm]:
    """Every policy (default: all registered) under every pool setting; ``oracle`` adds twins."""
    chosen = [parse_policy(p) for p in (policies or names())]
    if oracle:
        chosen += [(p, True) for p, o in chosen if not o]
    return [SimArm(p, pool, o) for pool in pools for p, o in chosen]


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
            pool_bytes: int | None = None) -> ArmRecords:
    """A fresh cluster and policy; the workload built from ``random.Random(seed)``."""
    cluster = Cluster(profile, replicas, pool_on=arm.pool_on, pool_bytes=pool_bytes,
                      oracle=arm.oracle)
    load = workload(random.Random(seed))
    # CPU time of this process: a measure of the simulator's own cost, not an input to it.
    t0 = time.process_time()
    records = Run(cluster, create(arm.policy), load, arm.label).execute()
    return ArmRecords(arm, records, cluster.loop.handled, time.process_time() - t0)


def session_totals(records: Iterable[Record]) -> dict[str, float]:
    """Per session: first arrival to last token (the study's session time)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for r in records:
        first[r.session] = min(first.get(r.session, r.arrival), r.arrival)
        last[r.session] = max(last.get(r.session, 0.0), r.arrival + r.total_s)
    return {s: last[s] - first[s] for s in first}
