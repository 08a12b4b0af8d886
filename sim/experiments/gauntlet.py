"""The gauntlet: every policy over workloads, loads, hardware, fleets and routers it was not tuned on.

Design (not a full cross product): a base cell (``study-27b`` hardware, 4 replicas, 1
router, pool on) and one axis varied at a time.

- ``core``: every selected workload x every load, on the base cell;
- ``hardware``: each non-base hardware row (``HARDWARE``) x the axis workloads x loads; a
  row is ``base`` with one term changed, or (``MEASURED``: ``h200-27b``) a profile fitted
  to measurements on other hardware, whatever the base;
- ``fleet``: each non-base replica count x the axis workloads x loads (the arrival rate
  scales with the fleet: ``rate_scale * replicas / 4``);
- ``routers``: each router count > 1 x the axis workloads x loads (``run_arm(routers=R)``:
  each router sees only its own requests, ``sim.des.cluster``).

A cell is ``(workload, hardware, replicas, routers)``; its loads are multipliers of the
workload's knee. Every (cell, load, policy, seed) is one simulation of ``duration_s``
seconds of arrivals; the first ``warmup`` fraction, and arrivals after the horizon (the
tail of sessions already open, under falling load), are not measured.

Knee (per workload, base cell, seed 0, the baselines only: every selected policy but the
``locality`` variants): ``b(s)`` is the best baseline p90 TTFT at rate scale ``s`` (the
generator's nominal rate times ``s``, ``sim.des.generators.NOMINAL_RATE``).

1. light: ``b(LIGHT)`` with ``LIGHT = 0.1``, p90 the mean of seeds 0 and 1 (few requests);
   the threshold is ``KNEE_FACTOR = 5`` times it.
2. bracket: from ``s = 1``, double while ``b(s)`` is under the threshold, else halve while
   it is over (at most ``BRACKET_STEPS`` steps each way), giving ``lo < hi`` with
   ``b(lo) <`` threshold ``<= b(hi)``.
3. bisect geometrically ``iters`` times (``mid = sqrt(lo * hi)``); the knee is
   ``sqrt(lo * hi)`` of the final bracket. Every probe is kept in the JSON.

The SLO of capacity is that same threshold, in seconds, per workload: a policy's capacity
in a cell is the highest load multiplier up to which (every lower one included) its p90
TTFT (mean over seeds) stays at or under ``KNEE_FACTOR`` x the base cell's light-load best
p90. Hardware rows keep the policy's own prior (the study fit): the point is a prior that
does not match the physics; ``--oracle-prior`` adds a ``locality+oracle-prior`` arm.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.des.generators import GENERATORS
from sim.des.simulation import Record
from sim.des.workload import Workload
from sim.experiments.arms import NoProgress, Progress, parse_policy, run_arm
from sim.replica.profiles import Profile, load_profile

BASE_HW, BASE_REPLICAS, BASE_ROUTERS = "study-27b", 4, 1
HARDWARE = ("study-27b", "prefill-0.33x", "prefill-3x", "attn-3x", "pool-4x-slower",
            "small-gpu", "no-pool", "hetero", "h200-27b", "batched")
MEASURED = ("h200-27b",)  # rows that are a measured profile (docs/calibration.md), not derived
LOADS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
AXIS_WORKLOADS = ("mooncake", "agents", "docqa")
LIGHT, KNEE_FACTOR, BRACKET_STEPS = 0.1, 5.0, 6
HETERO_SLOWDOWN = 2.0
BATCHED_FIXED_SHARE = 0.25  # "batched": a queued prompt pays this share of the fixed term
WARMUP = 0.1


def hardware_row(name: str, base: Profile) -> tuple[Profile, bool, Profile | None]:
    """(profile, pool on, slow replica-0 profile or None) of a hardware row, from ``base``."""
    r = dataclasses.replace
    if name == BASE_HW:
        return base, True, None
    if name in MEASURED:  # measured physics; the policy keeps the study's prior
        return load_profile(name), True, None
    if name in ("prefill-0.33x", "prefill-3x"):
        k = 1 / 3 if name == "prefill-0.33x" else 3.0
        return r(base, name=name, prefill_fixed_s=base.prefill_fixed_s * k,
                 prefill_token_s=base.prefill_token_s * k,
                 prefill_token2_s=base.prefill_token2_s * k), True, None
    if name == "attn-3x":
        return r(base, name=name, prefill_token2_s=base.prefill_token2_s * 3), True, None
    if name == "pool-4x-slower":
        return r(base, name=name, load_bytes_per_s=base.load_bytes_per_s / 4,
                 load_fixed_s=base.load_fixed_s * 4), True, None
    if name == "small-gpu":
        return r(base, name=name, gpu_kv_bytes=base.gpu_kv_bytes // 4), True, None
    if name == "no-pool":
        return r(base, name=name), False, None
    if name == "batched":  # an engine that batches queued prompts (vLLM), not one at a time
        return r(base, name=name, queued_fixed_share=BATCHED_FIXED_SHARE), True, None
    if name == "hetero":
        k = HETERO_SLOWDOWN
        slow = r(base, name="hetero-slow", prefill_fixed_s=base.prefill_fixed_s * k,
                 prefill_token_s=base.prefill_token_s * k,
                 prefill_token2_s=base.prefill_token2_s * k, tpot_s=base.tpot_s * k,
                 tpot_context_s=base.tpot_context_s * k)
        return r(base, name=name), True, slow
    raise ValueError(f"unknown hardware row {name!r}; known: {', '.join(HARDWARE)}")


@dataclass(frozen=True, slots=True)
class Cell:
    """One row of the gauntlet: a workload on a deployment; ``axis`` says what it varies."""

    axis: str
    workload: str
    hardware: str = BASE_HW
    replicas: int = BASE_REPLICAS
    routers: int = BASE_ROUTERS

    @property
    def label(self) -> str:
        return f"{self.workload} {self.hardware} {self.replicas}r {self.routers}R"


@dataclass(frozen=True, slots=True)
class Job:
    """One simulation: a cell's deployment, a rate scale, one policy, one seed."""

    workload: str
    hardware: str
    replicas: int
    routers: int
    rate_scale: float
    policy: str
    seed: int
    duration_s: float
    base_profile: str
    shared_index: bool = False  # routers share one index (Redis), else each its own


def design(workloads: Sequence[str], hardware: Sequence[str], replicas: Sequence[int],
           routers: Sequence[int], axis_workloads: Sequence[str] = AXIS_WORKLOADS) -> list[Cell]:
    """The cells: the core grid, then one axis at a time for the axis workloads."""
    cells = [Cell("core", w) for w in workloads]
    sub = [w for w in workloads if w in axis_workloads] or list(workloads[:1])
    cells += [Cell("hardware", w, hardware=h) for h in hardware if h != BASE_HW for w in sub]
    cells += [Cell("fleet", w, replicas=n) for n in replicas if n != BASE_REPLICAS for w in sub]
    cells += [Cell("routers", w, routers=k) for k in routers if k != BASE_ROUTERS for w in sub]
    return cells


def records(job: Job) -> list[Record]:
    """Every finished request of one job's simulation."""
    profile, pool_on, slow = hardware_row(job.hardware, load_profile(job.base_profile))
    arm = dataclasses.replace(parse_policy(job.policy), pool_on=pool_on)
    gen = GENERATORS[job.workload]
    scale = job.rate_scale * job.replicas / BASE_REPLICAS

    def workload(rng: random.Random) -> Workload:
        return gen(rng, scale, job.duration_s, profile.chunk_tokens)

    return run_arm(profile, job.replicas, arm, workload, job.seed, routers=job.routers,
                   replica_profiles={"r0": slow} if slow is not None else None,
                   shared_index=job.shared_index).records


def measured(job: Job, done: Sequence[Record]) -> list[Record]:
    """The requests the gauntlet measures: arrivals in ``[WARMUP * T, T)``."""
    lo = WARMUP * job.duration_s
    return [r for r in done if lo <= r.arrival < job.duration_s and r.measured]


def simulate(job: Job) -> list[float]:
    """The measured TTFTs (seconds) of one job."""
    return [r.ttft_s for r in measured(job, records(job))]


def summarise(ttfts: Sequence[float]) -> dict[str, float]:
    """n, mean and p90 of one job's TTFTs (NaN when nothing was measured)."""
    if not ttfts:
        return {"n": 0, "mean": math.nan, "p90": math.nan}
    x = np.asarray(ttfts, dtype=float)
    return {"n": int(x.size), "mean": float(x.mean()), "p90": float(np.percentile(x, 90))}


class Runner:
    """Runs jobs, in ``jobs`` worker processes when > 1, reporting each to ``progress``."""

    def __init__(self, jobs: int = 1, progress: Progress | None = None) -> None:
        self.jobs = max(1, jobs)
        self.progress = progress or NoProgress()
        self._pool = ProcessPoolExecutor(self.jobs) if self.jobs > 1 else None

    def run(self, batch: Sequence[Job]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = []
        results = self._pool.map(simulate, batch) if self._pool else map(simulate, batch)
        for job, ttfts in zip(batch, results, strict=True):
            out.append(summarise(ttfts))
            self.progress.advance(f"{job.workload} {job.hardware} x{job.rate_scale:.3g} "
                                  f"{job.policy} s{job.seed}")
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def now_s() -> float:
    """Wall seconds (reported as the run's cost only; never a simulation input)."""
    return time.monotonic()


def is_locality(policy: str) -> bool:
    """``locality`` and its variants (options, ``+oracle-prior``): not baselines."""
    return policy.split("@")[0].split("+")[0] == "locality"


def find_knee(workload: str, baselines: Sequence[str], runner: Runner, *, duration_s: float,
              base_profile: str, iters: int) -> dict[str, Any]:
    """The workload's knee on the base cell (the module docstring's procedure)."""
    probes: list[dict[str, Any]] = []

    def best(scale: float, seeds: Sequence[int] = (0,)) -> float:
        batch = [Job(workload, BASE_HW, BASE_REPLICAS, BASE_ROUTERS, scale, p, s, duration_s,
                     base_profile) for p in baselines for s in seeds]
        res = runner.run(batch)
        by_policy = {p: float(np.nanmean([r["p90"] for j, r in zip(batch, res, strict=True)
                                          if j.policy == p])) for p in baselines}
        winner = min(by_policy, key=lambda p: by_policy[p] if by_policy[p] == by_policy[p]
                     else math.inf)
        probes.append({"rate_scale": scale, "best_policy": winner, "p90_s": by_policy[winner]})
        return by_policy[winner]

    light = best(LIGHT, (0, 1))
    threshold = KNEE_FACTOR * light
    lo, hi = LIGHT, math.inf
    s = 1.0
    for _ in range(BRACKET_STEPS):
        if best(s) < threshold:
            lo = max(lo, s)
            if hi < math.inf:
                break
            s *= 2
        else:
            hi = min(hi, s)
            if lo > LIGHT or s / 2 <= LIGHT:
                break
            s /= 2
    if hi == math.inf:
        hi = 2 * lo  # never saturated within the bracket steps: the last probe, doubled
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        if best(mid) < threshold:
            lo = mid
        else:
            hi = mid
    return {"rate_scale": math.sqrt(lo * hi), "bracket": [lo, hi], "light_rate_scale": LIGHT,
            "light_p90_s": light, "slo_p90_s": threshold, "probes": probes}


@dataclass(frozen=True, slots=True)
class GauntletConfig:
    """What to run; defaults are the full gauntlet (``--quick`` narrows them in the CLI)."""

    workloads: tuple[str, ...] = tuple(GENERATORS)
    policies: tuple[str, ...] = ()  # empty: every registered policy
    hardware: tuple[str, ...] = HARDWARE
    replicas: tuple[int, ...] = (2, 4, 8, 16)
    routers: tuple[int, ...] = (1, 4)
    loads: tuple[float, ...] = LOADS
    seeds: int = 3
    duration_s: float = 900.0
    base_profile: str = "study-27b"
    oracle_prior: bool = False
    knee_iters: int = 3
    knees: tuple[tuple[str, float], ...] = ()  # given knees (workload, rate scale): no search
    # (workload, light-load p90 s, SLO p90 s) of given knees, from an earlier run: capacity
    knee_slos: tuple[tuple[str, float, float], ...] = ()
    axis_workloads: tuple[str, ...] = AXIS_WORKLOADS
    shared_index: bool = False  # several routers share one index (``--index redis://``)
    jobs: int = 1

    def validate(self) -> None:
        unknown = [w for w in self.workloads if w not in GENERATORS]
        if unknown:
            raise ValueError(f"unknown workloads {unknown}; known: {', '.join(GENERATORS)}")
        for h in self.hardware:
            hardware_row(h, load_profile(self.base_profile))
        for p in self.policies:
            parse_policy(p)
        if self.seeds < 1 or self.duration_s <= 0 or not self.loads:
            raise ValueError("need seeds >= 1, duration > 0 and at least one load")
        if any(n < 1 for n in (*self.replicas, *self.routers)):
            raise ValueError("replicas and routers must be >= 1")


def chosen_policies(cfg: GauntletConfig) -> list[str]:
    from policies.registry import names

    chosen = list(cfg.policies or names())
    if cfg.oracle_prior and "locality+oracle-prior" not in chosen:
        chosen.append("locality+oracle-prior")
    return chosen


def run_gauntlet(cfg: GauntletConfig, progress: Progress | None = None) -> dict[str, Any]:
    """Knees, then every (cell, load, policy, seed); raw per-seed rows."""
    cfg.validate()
    progress = progress or NoProgress()
    policies = chosen_policies(cfg)
    baselines = [p for p in policies if not is_locality(p)] or ["round_robin"]
    cells = design(cfg.workloads, cfg.hardware, cfg.replicas, cfg.routers, cfg.axis_workloads)
    # Every cell of the design runs now; ``skipped`` stays in the document's schema.
    skipped: list[dict[str, str]] = []
    given = dict(cfg.knees)
    slos = {w: (light, slo) for w, light, slo in cfg.knee_slos}
    runner = Runner(cfg.jobs, progress)
    t0 = now_s()
    try:
        knees: dict[str, dict[str, Any]] = {}
        for w in cfg.workloads:
            if w in given:
                knees[w] = {"rate_scale": given[w], "given": True}
                if w in slos:
                    knees[w].update(light_p90_s=slos[w][0], slo_p90_s=slos[w][1])
                continue
            progress.start(len(baselines) * (5 + cfg.knee_iters), f"knee {w}")
            knees[w] = find_knee(w, baselines, runner, duration_s=cfg.duration_s,
                                 base_profile=cfg.base_profile, iters=cfg.knee_iters)
        batch = [Job(c.workload, c.hardware, c.replicas, c.routers,
                     knees[c.workload]["rate_scale"] * m, p, s, cfg.duration_s, cfg.base_profile,
                     cfg.shared_index)
                 for c in cells for m in cfg.loads for p in policies for s in range(cfg.seeds)]
        progress.start(len(batch), "gauntlet")
        results = runner.run(batch)
    finally:
        runner.close()
    keys = [(c, m) for c in cells for m in cfg.loads for _ in policies for _ in range(cfg.seeds)]
    raw = [raw_row(c, m, j, res) for (c, m), j, res in zip(keys, batch, results, strict=True)]
    return {"policies": policies, "baselines": baselines, "cells": [cell_fields(c) for c in cells],
            "knees": knees, "raw": raw, "skipped": skipped, "wall_s": now_s() - t0}


def raw_row(c: Cell, load: float, job: Job, result: dict[str, float]) -> dict[str, Any]:
    """One job's row of the raw results: its cell, load (x knee), policy, seed, summary."""
    return {**cell_fields(c), "load": load, "rate_scale": job.rate_scale, "policy": job.policy,
            "seed": job.seed, **result}


def cell_fields(c: Cell) -> dict[str, Any]:
    """A cell's keys in the raw rows (``gauntlet_report.CELL_KEYS``)."""
    return {"cell": c.label, "axis": c.axis, "workload": c.workload, "hardware": c.hardware,
            "replicas": c.replicas, "routers": c.routers}
