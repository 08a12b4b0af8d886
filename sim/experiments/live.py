"""Live load experiment: emulated replicas + the real router, policies under rising load.

``lmroute live`` measures what the simulator predicts, over real HTTP: for each load level
and each policy, on fresh state (new replicas sharing a new pool, a new router), sessions
arrive as a Poisson process of ``load`` sessions per model second and run concurrently
through the router; every turn is streamed and timed (``sim.experiments.session``).

Workload (seeded, identical for every policy at one load level, so cells are paired):
``sessions`` sessions; session ``i`` starts with a document of log-uniform length in
[``min_start_tokens``, ``max_start_tokens``], then ``turns`` turns, each adding the reply
and ``added_tokens`` of new user text, separated by exponential think times of mean
``think_s``. Heterogeneous prompt sizes matter: a count of queued requests (what
``least_loaded`` balances) is a poor measure of queued prefill work.

``--kill-at S`` stops replica 0 at model second S of every cell (replica loss: its
sessions must move); each turn's row carries when the stop began and ended. Results
follow the simulator's JSON contract: rows with policy, pool, load, n and TTFT
mean/p50/p90/p99 in model seconds (wall / ``time_scale``).

Presented as a markdown table per (load, policy), with ``--kill-at`` a failover summary
per (policy, load) cell (``failover_summary``), and a plot of mean and p90 TTFT against load.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import numpy as np

from sim.emulator.deployment import emulated_deployment
from sim.experiments import report
from sim.experiments.session import (
    Messages,
    SessionScript,
    TurnResult,
    log_uniform_tokens,
    run_session,
    text_of,
)
from sim.replica.profiles import load_profile


@dataclass(frozen=True, slots=True)
class LiveConfig:
    policies: tuple[str, ...]
    loads: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2)
    replicas: int = 2
    pool: bool = True
    sessions: int = 16
    turns: int = 4
    min_start_tokens: int = 4_096
    max_start_tokens: int = 65_536
    added_tokens: int = 1_024
    output_tokens: int = 8
    think_s: float = 5.0
    time_scale: float = 0.1
    profile: str = "study-27b"
    kill_at: float | None = None
    seed: int = 0


@dataclass(frozen=True, slots=True)
class LiveSession:
    """One live session's seeded shape: arrival, start size and think times (model s)."""

    index: int
    arrival_s: float
    start_tokens: int
    thinks_s: tuple[float, ...]


def plan_sessions(cfg: LiveConfig, load: float) -> list[LiveSession]:
    rng = random.Random(f"{cfg.seed}/{load}")
    t = 0.0
    out = []
    for i in range(cfg.sessions):
        t += rng.expovariate(load)
        start = int(log_uniform_tokens(rng, cfg.min_start_tokens, cfg.max_start_tokens))
        thinks = tuple(rng.expovariate(1.0 / cfg.think_s) for _ in range(cfg.turns - 1))
        out.append(LiveSession(i, t, start, thinks))
    return out


def _script(plan: LiveSession, cfg: LiveConfig) -> SessionScript:
    seed = cfg.seed * 1_000_003 + plan.index

    def follow(k: int, history: Messages, reply: str) -> Messages:
        return [*history, {"role": "assistant", "content": reply},
                {"role": "user", "content": text_of(seed + k, cfg.added_tokens)}]

    return SessionScript(f"live-{plan.index}", cfg.turns,
                         [{"role": "user", "content": text_of(seed, plan.start_tokens)}],
                         follow, lambda k: cfg.output_tokens, plan.thinks_s, plan.arrival_s)


def _rows(index: int, turns: list[TurnResult]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for t in turns:
        row: dict[str, Any] = {"session": index, "turn": t.turn, "sent_s": t.sent_s}
        rows.append(row | (asdict(t.timing) if t.timing is not None else {"error": t.error}))
    return rows


async def _session(client: httpx.AsyncClient, url: str, plan: LiveSession, cfg: LiveConfig,
                   t0: float, on_turn: Callable[[], None]) -> list[dict[str, Any]]:
    turns = await run_session(client, url, _script(plan, cfg), time_scale=cfg.time_scale,
                              t0=t0, on_turn=on_turn)
    return _rows(plan.index, turns)


def summarize(policy: str, pool: bool, load: float, turns: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [t["ttft_s"] for t in turns if "ttft_s" in t]
    arr = np.asarray(ok) if ok else np.asarray([math.nan])
    return {
        "policy": policy, "pool": "on" if pool else "off", "load": load, "n": len(ok),
        "errors": len(turns) - len(ok),
        "ttft_mean_s": float(arr.mean()), "ttft_p50_s": float(np.percentile(arr, 50)),
        "ttft_p90_s": float(np.percentile(arr, 90)), "ttft_p99_s": float(np.percentile(arr, 99)),
    }


async def run_cell(cfg: LiveConfig, policy: str, load: float,
                   on_turn: Callable[[], None]) -> list[dict[str, Any]]:
    """One (policy, load) cell on fresh replicas, pool and router; returns every turn."""
    plans = plan_sessions(cfg, load)
    async with emulated_deployment(load_profile(cfg.profile), policy=policy, pool_on=cfg.pool,
                                   model="emulated-27b", time_scale=cfg.time_scale,
                                   replicas=cfg.replicas, health_interval_s=0.5,
                                   eject_after=1) as deployment, \
            httpx.AsyncClient(timeout=httpx.Timeout(900.0),
                              limits=httpx.Limits(max_connections=512)) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_session(client, deployment.router_url, p, cfg, t0,
                                              on_turn)) for p in plans]
        kill: dict[str, float | None] = {"kill_began_s": None, "killed_s": None}
        if cfg.kill_at is not None:
            await asyncio.sleep(cfg.kill_at * cfg.time_scale)
            # When the stop began and when the replica was gone, not when it was asked to go:
            # on a busy machine the sleep overruns ``kill_at``, and the stop itself takes a
            # while, in which turns can still reach the replica or already fail over.
            kill["kill_began_s"] = (time.perf_counter() - t0) / cfg.time_scale
            await deployment.stop_replica(0)
            kill["killed_s"] = (time.perf_counter() - t0) / cfg.time_scale
        results = await asyncio.gather(*tasks)
    lost = deployment.replica_urls[0] if cfg.kill_at is not None else None
    return [row | {"policy": policy, "load": load, "lost_replica": lost} | kill
            for rows in results for row in rows]


async def run_live(cfg: LiveConfig, on_turn: Callable[[], None] = lambda: None
                   ) -> dict[str, Any]:
    """Every load level x every policy; returns the JSON document."""
    began = time.perf_counter()
    turns: list[dict[str, Any]] = []
    rows = []
    for load in cfg.loads:
        for policy in cfg.policies:
            cell = await run_cell(cfg, policy, load, on_turn)
            turns += cell
            rows.append(summarize(policy, cfg.pool, load, cell))
    return {"scenario": "live", "params": asdict(cfg), "rows": rows, "turns": turns,
            "units": "model seconds (wall seconds / time_scale)",
            "wall_s": time.perf_counter() - began}


def table(doc: dict[str, Any]) -> str:
    lines = ["| load | policy | n | errors | TTFT mean | p50 | p90 | p99 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['load']} | {r['policy']} | {r['n']} | {r['errors']} | "
                     f"{r['ttft_mean_s']:.3f} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | "
                     f"{r['ttft_p99_s']:.3f} |")
    return "\n".join(lines)


def failover_summary(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (policy, load) cell, with ``--kill-at``: the first turn of each session that had to
    leave the lost replica, against that cell's own pool-hit and first turns (model seconds).

    A session moved at its first turn sent after the stop began (``kill_began_s``, which a
    busy machine puts after ``kill_at``) that went elsewhere while its turn before went to
    the lost replica; a turn that still reached the replica while it stopped is no move.
    Documents from before the time was recorded carry only ``kill_at``."""
    out = []
    for policy, load in dict.fromkeys((t["policy"], t["load"]) for t in doc["turns"]):
        turns = sorted((t for t in doc["turns"]
                        if t["policy"] == policy and t["load"] == load and "ttft_s" in t),
                       key=lambda t: t["sent_s"])
        if not turns:
            continue
        lost = turns[0]["lost_replica"]
        kill = turns[0].get("kill_began_s") or doc["params"]["kill_at"]
        last: dict[int, str] = {}
        moved: list[float] = []
        for t in turns:
            if t["sent_s"] >= kill and last.get(t["session"]) == lost and t["replica"] != lost:
                moved.append(t["ttft_s"])
            last[t["session"]] = t["replica"]
        pool = [t["ttft_s"] for t in turns if t["reason"] == "pool-hit"]
        cold = [t["ttft_s"] for t in turns if t["turn"] == 0]
        out.append({"policy": policy, "load": load, "moved_sessions": len(moved),
                    "moved_first_turn_ttft_median_s": _median(moved),
                    "pool_hit_ttft_median_s": _median(pool),
                    "first_turn_ttft_median_s": _median(cold)})
    return out


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def plot(doc: dict[str, Any], path: str) -> None:
    """Mean and p90 TTFT against load, one line per policy (locality drawn bold)."""
    with report.figure(path, 2, (11, 4.2), sharex=True) as (fig, axes):
        _plot_rows(fig, axes, doc)


def _plot_rows(fig: Any, axes: Any, doc: dict[str, Any]) -> None:
    policies = list(dict.fromkeys(r["policy"] for r in doc["rows"]))
    for policy in policies:
        rows = sorted((r for r in doc["rows"] if r["policy"] == policy), key=lambda r: r["load"])
        loads = [r["load"] for r in rows]
        style = {"linewidth": 2.5} if policy == "locality" else {"linewidth": 1.2}
        axes[0].plot(loads, [r["ttft_mean_s"] for r in rows], marker="o", label=policy, **style)
        axes[1].plot(loads, [r["ttft_p90_s"] for r in rows], marker="o", label=policy, **style)
    for ax, title in zip(axes, ("mean TTFT", "p90 TTFT"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("session arrivals per model second")
        ax.set_ylabel("model seconds")
        ax.set_yscale("log")
        report.plain_log_axis(ax.yaxis, "%.1f")
        ax.grid(alpha=0.3)
    axes[0].legend()
    p = doc["params"]
    fig.suptitle(f"live: {p['replicas']} emulated replicas ({p['profile']}), pool "
                 f"{'on' if p['pool'] else 'off'}, {p['sessions']} sessions x {p['turns']} turns")
