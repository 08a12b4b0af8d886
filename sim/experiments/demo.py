"""``lmroute demo``: two emulated replicas sharing a pool, the router, policies compared.

For each routing policy (``policies.registry.names()`` unless ``--policies``) and each pool
setting (off, on), on fresh state — new replicas, a new pool, a new router, like the
study's restart blocks — the demo serves two model replicas (``--profile``, default the
study's fitted ``study-27b``) and the router (``router.app.create_app``, the embedded
default: memory index, no Redis) with uvicorn on 127.0.0.1 in one event loop, then drives
``--sessions`` multi-turn chat sessions through the router over HTTP, one at a time:

- turn 1: a fresh document of ``--start-tokens`` tokens (session-seeded random text, the
  same for every configuration, so the comparison is paired);
- each later turn appends the reply and a new user message of ``--added-tokens`` tokens;
- replies are ``--output-tokens`` long, streamed; the session is sent as X-Session-ID.

Measured per turn (``sim.experiments.session``): TTFT = request sent to the first non-empty
content chunk; per session: first request sent to the last turn's end. Times are reported
in model seconds (wall / ``--time-scale``), so the HTTP overhead (a few ms a turn) is magnified by
1 / time scale (see docs/demo.md).

The study's shape to expect: alternating sessions get much faster with the pool (each turn
loads its history instead of recomputing it), fixed placement does not (its own GPU
already holds the history; the pool only adds a small store cost).

Presented as a rich table (two rows per policy, pool off and on: median TTFT of all turns
and of turns 2+, mean TTFT of turns 2+, mean session time, and the session time's change
when the pool is turned on) and a plot: mean session time per policy, pool off vs on,
beside the mean TTFT of turns 2+ (the turns a pool can help; the mean keeps the cold
second turn of a moved session that a median would hide).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import xxhash
from rich.table import Table

from sim.emulator.deployment import emulated_deployment
from sim.experiments import report
from sim.experiments.session import MODEL, Messages, SessionScript, run_session, text_of
from sim.replica.profiles import Profile, load_profile


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """What the demo runs (see the module docstring); ``seed`` fixes the session texts."""

    policies: tuple[str, ...]
    profile: str = "study-27b"
    sessions: int = 3
    turns: int = 6
    start_tokens: int = 32_768
    added_tokens: int = 2_048
    output_tokens: int = 8
    time_scale: float = 0.1
    seed: int = 0


def _script(index: int, cfg: DemoConfig) -> SessionScript:
    seed = xxhash.xxh3_64_intdigest(f"{cfg.seed}/{index}".encode())

    def follow(k: int, history: Messages, reply: str) -> Messages:
        return [*history, {"role": "assistant", "content": reply},
                {"role": "user", "content": text_of(seed + k, cfg.added_tokens)}]

    return SessionScript(f"session-{index}", cfg.turns,
                         [{"role": "user", "content": text_of(seed, cfg.start_tokens)}],
                         follow, lambda k: cfg.output_tokens)


async def _session(client: httpx.AsyncClient, url: str, index: int, cfg: DemoConfig,
                   on_turn: Callable[[], None]) -> dict[str, Any]:
    turns = await run_session(client, url, _script(index, cfg), time_scale=cfg.time_scale,
                              on_turn=on_turn, errors="raise")
    timings = [t.timing for t in turns if t.timing is not None]
    total = turns[-1].sent_s + timings[-1].total_s
    return {"session": index, "total_s": total, "turns": [asdict(t) for t in timings]}


async def run_configuration(cfg: DemoConfig, profile: Profile, policy: str, pool_on: bool,
                            on_turn: Callable[[], None]) -> dict[str, Any]:
    """One (policy, pool) cell on fresh replicas, pool and router."""
    async with emulated_deployment(profile, policy=policy, pool_on=pool_on,
                                   model=MODEL, time_scale=cfg.time_scale) as deployment, \
            httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        sessions = [await _session(client, deployment.router_url, i, cfg, on_turn)
                    for i in range(cfg.sessions)]
    ttfts = [t["ttft_s"] for s in sessions for t in s["turns"]]
    later = [t["ttft_s"] for s in sessions for t in s["turns"][1:]]
    return {
        "policy": policy,
        "pool": "on" if pool_on else "off",
        "median_ttft_s": statistics.median(ttfts),
        "median_ttft_later_turns_s": statistics.median(later) if later else None,
        "mean_ttft_later_turns_s": statistics.fmean(later) if later else None,
        "mean_session_s": statistics.fmean(s["total_s"] for s in sessions),
        "sessions": sessions,
    }


async def run_demo(cfg: DemoConfig, on_turn: Callable[[], None] = lambda: None
                   ) -> dict[str, Any]:
    """Every policy with the pool off then on; returns the JSON document."""
    began = time.perf_counter()
    profile = load_profile(cfg.profile)
    results = []
    for policy in cfg.policies:
        for pool_on in (False, True):
            results.append(await run_configuration(cfg, profile, policy, pool_on, on_turn))
    by = {(r["policy"], r["pool"]): r["mean_session_s"] for r in results}
    gain = {p: 100.0 * (by[p, "on"] - by[p, "off"]) / by[p, "off"] for p in cfg.policies}
    return {
        "config": asdict(cfg),
        "units": "model seconds (wall seconds / time_scale)",
        "results": results,
        "session_change_with_pool_pct": gain,
        "wall_s": time.perf_counter() - began,
    }


def _cells(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["policy"], r["pool"]): r for r in result["results"]}


def build_table(result: dict[str, Any]) -> Table:
    cfg = result["config"]
    table = Table(title=(f"{cfg['sessions']} sessions x {cfg['turns']} turns per cell, "
                         f"{cfg['start_tokens']:,}-token start, profile {cfg['profile']}; "
                         "model seconds"),
                  caption=(f"2+: turns 2 and later; session: mean session time; change: "
                           f"session time, pool on vs off. Wall time {result['wall_s']:.0f} s, "
                           f"time scale {cfg['time_scale']}"))
    for name in ("policy", "pool", "TTFT p50", "2+ p50", "2+ mean", "session", "change"):
        table.add_column(name, justify="left" if name in ("policy", "pool") else "right",
                         no_wrap=name == "policy")
    cells = _cells(result)
    for policy in result["config"]["policies"]:
        for pool in ("off", "on"):
            c = cells[policy, pool]
            change = result["session_change_with_pool_pct"][policy]
            table.add_row(
                policy if pool == "off" else "", pool, f"{c['median_ttft_s']:.3f}",
                f"{c['median_ttft_later_turns_s'] or 0:.3f}",
                f"{c['mean_ttft_later_turns_s'] or 0:.3f}", f"{c['mean_session_s']:.2f}",
                f"{change:+.1f} %" if pool == "on" else "",
                end_section=pool == "on",
            )
    return table


def write_plot(result: dict[str, Any], path: str | Path) -> None:
    import numpy as np

    cfg = result["config"]
    policies = list(cfg["policies"])
    cells = _cells(result)
    x = np.arange(len(policies))
    width = 0.38
    with report.figure(path, 2, (11, 4.2)) as (fig, (left, right)):
        for offset, pool, color in ((-width / 2, "off", "#9aa5b1"), (width / 2, "on", "#2f7ed8")):
            sessions = [cells[p, pool]["mean_session_s"] for p in policies]
            later = [cells[p, pool]["mean_ttft_later_turns_s"] or 0.0 for p in policies]
            left.bar(x + offset, sessions, width, label=f"pool {pool}", color=color)
            right.bar(x + offset, later, width, label=f"pool {pool}", color=color)
        left.set_title("mean session time (6 turns)" if cfg["turns"] == 6
                       else "mean session time")
        right.set_title("mean TTFT, turns 2+")
        for ax in (left, right):
            ax.set_ylabel("model seconds")
            ax.set_xticks(x, policies, rotation=20)
            ax.legend(loc="lower right", framealpha=0.9)
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"lmroute demo: two emulated {cfg['profile']} replicas, "
                     f"{cfg['start_tokens']:,}-token sessions")
