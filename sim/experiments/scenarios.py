"""The simulator's scenarios beyond the study design (that one is ``sim.experiments.reproduce``).

- ``cross_replica``: a document of 8k/32k/128k/256k tokens asked twice, one pair after
  another on 2 replicas: the first ask is cold; the second goes where the policy sends it
  (``fixed``: the same replica, ``alternating``: the other one), pool off and on. Row
  ``case``: ``cold``, ``same`` or ``other`` (where the second ask actually ran).
- ``sessions``: six-turn study sessions from 32k and 128k, ``fixed`` vs ``alternating``,
  pool off vs on; session totals and their paired change (pool on vs off).
- ``load``: Poisson session arrivals (``SessionMix``) at rising load, in sessions per
  minute per replica, on N replicas; every policy, pool off and on. The first
  ``warmup`` fraction of the horizon is not measured.
- ``pool_pressure``: the ``load`` workload at one load, pool capacity from ample to
  scarce (LRU eviction); pool-off rows as the floor.
- ``trace``: a Mooncake-format trace replayed open loop (``sim.des.trace``), every policy,
  pool off and on; reports simulated requests per CPU second.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sim.des.simulation import Record
from sim.des.trace import TraceRecord, trace_workload
from sim.des.workload import (
    KeyAlloc,
    SessionMix,
    SessionWorkload,
    Workload,
    poisson_sessions,
    prefix_chain,
    study_session,
)
from sim.experiments.arms import NoProgress, Progress, Result, arms, run_arm, session_totals
from sim.experiments.stats import group_rows, paired, summary
from sim.replica.profiles import GIB, Profile

CROSS_SIZES = (8192, 32768, 131072, 262144)
SESSION_STARTS = (32768, 131072)


def _k(tokens: int) -> str:
    return f"{tokens // 1024}k"


def cross_replica(profile: Profile, *, policies: Sequence[str] | None = None, reps: int = 8,
                  seed: int = 0, jitter: float = 0.25, oracle: bool = False,
                  progress: Progress | None = None) -> Result:
    progress = progress or NoProgress()
    chosen = arms(policies or ["fixed", "alternating"], oracle=oracle)
    progress.start(len(chosen), "cross-replica")

    def workload(rng: random.Random) -> Workload:
        keys = KeyAlloc()
        return SessionWorkload([
            prefix_chain(keys, rng, f"doc{i}-{size}", size, profile.chunk_tokens,
                         jitter=jitter, tag=_k(size))
            for i in range(reps) for size in CROSS_SIZES])

    rows: list[dict[str, Any]] = []
    nprng = np.random.default_rng(seed)
    for arm in chosen:
        run = run_arm(profile, 2, arm, workload, seed)
        first = {r.session: r.replica for r in run.records if r.turn == 0}
        cased = [dataclasses.replace(r, tag=f"{r.tag}/{_case(r, first)}") for r in run.records]
        for row in group_rows(cased, ("policy", "pool", "tag"), nprng):
            size, case = row.pop("tag").split("/")
            rows.append({**row, "tokens": size, "case": case})
        progress.advance(arm.label)
    order = {"cold": 0, "same": 1, "other": 2}
    rows.sort(key=lambda r: (int(r["tokens"][:-1]), order[r["case"]], r["pool"], r["policy"]))
    return Result("cross-replica", {"profile": profile.name, "replicas": 2, "reps": reps,
                                    "seed": seed, "jitter": jitter, "sizes": list(CROSS_SIZES)},
                  rows)


def _case(r: Record, first: dict[str, str]) -> str:
    if r.turn == 0:
        return "cold"
    return "same" if r.replica == first[r.session] else "other"


def sessions(profile: Profile, *, policies: Sequence[str] | None = None, reps: int = 8,
             seed: int = 0, jitter: float = 0.05, oracle: bool = False,
             progress: Progress | None = None) -> Result:
    progress = progress or NoProgress()
    chosen = arms(policies or ["fixed", "alternating"], oracle=oracle)
    progress.start(len(chosen) * len(SESSION_STARTS), "sessions")
    rows: list[dict[str, Any]] = []
    changes: list[dict[str, Any]] = []
    nprng = np.random.default_rng(seed)
    for start in SESSION_STARTS:
        def workload(rng: random.Random, start: int = start) -> Workload:
            keys = KeyAlloc()
            return SessionWorkload([study_session(keys, rng, f"s{i}-{start}", start,
                                                  profile.chunk_tokens, jitter=jitter,
                                                  tag=_k(start)) for i in range(reps)])

        totals: dict[tuple[str, str], list[float]] = {}
        for arm in chosen:
            run = run_arm(profile, 2, arm, workload, seed)
            t = session_totals(run.records)
            totals[(arm.label, arm.pool)] = [t[s] for s in sorted(t)]
            row = group_rows(run.records, ("policy", "pool", "tag"), nprng)[0]
            row["start_tokens"] = row.pop("tag")
            row.update(summary(totals[(arm.label, arm.pool)], nprng, prefix="session"))
            row["n"] = len(run.records)
            rows.append(row)
            progress.advance(f"{arm.label} {_k(start)} pool {arm.pool}")
        for label in dict.fromkeys(a.label for a in chosen):
            if (label, "off") in totals and (label, "on") in totals:
                d = paired(totals[(label, "off")], totals[(label, "on")], nprng)
                changes.append({"policy": label, "start_tokens": _k(start), **d})
    return Result("sessions", {"profile": profile.name, "replicas": 2, "reps": reps, "seed": seed,
                               "jitter": jitter, "starts": list(SESSION_STARTS)},
                  rows, extra={"changes": changes})


def _steady(records: list[Record], warmup_s: float) -> list[Record]:
    return [r for r in records if r.arrival >= warmup_s]


def _sweep(profile: Profile, replicas: int, points: Sequence[tuple[float, int | None]],
           policies: Sequence[str] | None, seed: int, duration_s: float, warmup: float,
           mix: SessionMix, oracle: bool, progress: Progress, what: str,
           pool_off: Callable[[int], bool]) -> list[dict[str, Any]]:
    """Rows for (load, pool bytes) points: every arm, pool-off arms where ``pool_off(i)``."""
    chosen = arms(policies, oracle=oracle)
    jobs = [(i, a) for i in range(len(points)) for a in chosen if a.pool_on or pool_off(i)]
    progress.start(len(jobs), what)
    nprng = np.random.default_rng(seed)
    rows = []
    for i, arm in jobs:
        load, pool_bytes = points[i]
        rate = load * replicas / 60.0

        def workload(rng: random.Random, rate: float = rate) -> Workload:
            return poisson_sessions(rng, rate, duration_s, mix, profile.chunk_tokens)

        run = run_arm(profile, replicas, arm, workload, seed, pool_bytes)
        extra = {"load": load, "replicas": replicas,
                 "pool_gib": (pool_bytes or profile.pool_bytes) / GIB if arm.pool_on else 0.0}
        rows += group_rows(_steady(run.records, warmup * duration_s), ("policy", "pool"), nprng,
                           extra=extra)
        progress.advance(f"{arm.label} load {load} pool {extra['pool_gib']:g} GiB")
    return rows


def load(profile: Profile, *, replicas: int = 4, loads: Sequence[float] = (1, 2, 4, 6, 8, 10),
         policies: Sequence[str] | None = None, seed: int = 0, duration_s: float = 1800.0,
         warmup: float = 0.1, mix: SessionMix | None = None, oracle: bool = False,
         progress: Progress | None = None) -> Result:
    mix = mix or SessionMix()
    rows = _sweep(profile, replicas, [(x, None) for x in loads], policies, seed, duration_s,
                  warmup, mix, oracle, progress or NoProgress(), "load", lambda i: True)
    params = {"profile": profile.name, "replicas": replicas, "loads": list(loads), "seed": seed,
              "duration_s": duration_s, "warmup": warmup, "load_unit": "sessions/min/replica",
              "mix": dataclasses.asdict(mix)}
    return Result("load", params, rows)


def pool_pressure(profile: Profile, *, replicas: int = 4, load: float = 6.0,
                  pool_gib: Sequence[float] = (256, 64, 16, 4, 1),
                  policies: Sequence[str] | None = None, seed: int = 0, duration_s: float = 1800.0,
                  warmup: float = 0.1, mix: SessionMix | None = None, oracle: bool = False,
                  progress: Progress | None = None) -> Result:
    mix = mix or SessionMix()
    points = [(load, int(g * GIB)) for g in pool_gib]
    rows = _sweep(profile, replicas, points, policies, seed, duration_s, warmup, mix, oracle,
                  progress or NoProgress(), "pool-pressure", lambda i: i == 0)
    params = {"profile": profile.name, "replicas": replicas, "load": load,
              "pool_gib": list(pool_gib), "seed": seed, "duration_s": duration_s,
              "warmup": warmup, "mix": dataclasses.asdict(mix)}
    return Result("pool-pressure", params, rows)


def trace(profile: Profile, records: Sequence[TraceRecord], *, replicas: int = 8,
          policies: Sequence[str] | None = None, seed: int = 0, time_scale: float = 1.0,
          oracle: bool = False, source: str = "", progress: Progress | None = None) -> Result:
    progress = progress or NoProgress()
    chosen = arms(policies, oracle=oracle)
    progress.start(len(chosen), "trace")
    nprng = np.random.default_rng(seed)
    rows = []
    for arm in chosen:
        run = run_arm(profile, replicas, arm,
                      lambda _rng: trace_workload(records, profile.chunk_tokens,
                                                  time_scale=time_scale), seed)
        row = group_rows(run.records, ("policy", "pool"), nprng,
                         extra={"replicas": replicas, "load": time_scale})[0]
        row["sim_cpu_s"] = run.cpu_s
        row["sim_requests_per_s"] = len(run.records) / run.cpu_s if run.cpu_s > 0 else None
        rows.append(row)
        progress.advance(f"{arm.label} pool {arm.pool}")
    params = {"profile": profile.name, "replicas": replicas, "source": source,
              "requests": len(records), "time_scale": time_scale, "seed": seed}
    return Result("trace", params, rows)
