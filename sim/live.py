"""Live load experiment: emulated replicas + the real router, policies under rising load.

``lmroute live`` measures what the simulator predicts, over real HTTP: for each load level
and each policy, on fresh state (new replicas sharing a new pool, a new router), sessions
arrive as a Poisson process of ``load`` sessions per model second and run concurrently
through the router; every turn is streamed and timed (``sim.driver``).

Workload (seeded, identical for every policy at one load level, so cells are paired):
``sessions`` sessions; session ``i`` starts with a document of log-uniform length in
[``min_start_tokens``, ``max_start_tokens``], then ``turns`` turns, each adding the reply
and ``added_tokens`` of new user text, separated by exponential think times of mean
``think_s``. Heterogeneous prompt sizes matter: a count of queued requests (what
``least_loaded`` balances) is a poor measure of queued prefill work.

``--kill-at S`` stops replica 0 at model second S of every cell (replica loss: its
sessions must move). Results follow the simulator's JSON contract: rows with policy,
pool, load, n and TTFT mean/p50/p90/p99 in model seconds (wall / ``time_scale``).
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

from sim.deployment import emulated_deployment
from sim.driver import chat_turn, text_of
from sim.profiles import get_profile


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
class SessionPlan:
    index: int
    arrival_s: float
    start_tokens: int
    thinks_s: tuple[float, ...]


def plan_sessions(cfg: LiveConfig, load: float) -> list[SessionPlan]:
    rng = random.Random(f"{cfg.seed}/{load}")
    t = 0.0
    out = []
    lo, hi = math.log(cfg.min_start_tokens), math.log(cfg.max_start_tokens)
    for i in range(cfg.sessions):
        t += rng.expovariate(load)
        start = int(math.exp(rng.uniform(lo, hi)))
        thinks = tuple(rng.expovariate(1.0 / cfg.think_s) for _ in range(cfg.turns - 1))
        out.append(SessionPlan(i, t, start, thinks))
    return out


async def _session(client: httpx.AsyncClient, url: str, plan: SessionPlan, cfg: LiveConfig,
                   t0: float, on_turn: Callable[[], None]) -> list[dict[str, Any]]:
    await asyncio.sleep(max(0.0, t0 + plan.arrival_s * cfg.time_scale - time.perf_counter()))
    seed = cfg.seed * 1_000_003 + plan.index
    messages = [{"role": "user", "content": text_of(seed, plan.start_tokens)}]
    rows = []
    for k in range(cfg.turns):
        sent = (time.perf_counter() - t0) / cfg.time_scale
        try:
            turn, reply = await chat_turn(client, url, f"live-{plan.index}", messages,
                                          output_tokens=cfg.output_tokens,
                                          time_scale=cfg.time_scale)
        except (httpx.HTTPError, RuntimeError) as exc:
            rows.append({"session": plan.index, "turn": k, "sent_s": sent, "error": str(exc)})
            on_turn()
            return rows
        rows.append({"session": plan.index, "turn": k, "sent_s": sent, **asdict(turn)})
        on_turn()
        if k + 1 < cfg.turns:
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": text_of(seed + k + 1, cfg.added_tokens)}]
            await asyncio.sleep(plan.thinks_s[k] * cfg.time_scale)
    return rows


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
    async with emulated_deployment(get_profile(cfg.profile), policy=policy, pool_on=cfg.pool,
                                   model="emulated-27b", time_scale=cfg.time_scale,
                                   replicas=cfg.replicas, health_interval_s=0.5,
                                   eject_after=1) as deployment, \
            httpx.AsyncClient(timeout=httpx.Timeout(900.0),
                              limits=httpx.Limits(max_connections=512)) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_session(client, deployment.router_url, p, cfg, t0,
                                              on_turn)) for p in plans]
        if cfg.kill_at is not None:
            await asyncio.sleep(cfg.kill_at * cfg.time_scale)
            await deployment.stop_replica(0)
        results = await asyncio.gather(*tasks)
    lost = deployment.replica_urls[0] if cfg.kill_at is not None else None
    return [row | {"policy": policy, "load": load, "lost_replica": lost}
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
