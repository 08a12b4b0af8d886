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

Measured per turn: TTFT = request sent to the first non-empty content chunk; per session:
first request sent to the last turn's end. Times are reported in model seconds
(wall / ``--time-scale``), so the HTTP overhead (a few ms a turn) is magnified by
1 / time scale (see docs/demo.md).

The study's shape to expect: alternating sessions get much faster with the pool (each turn
loads its history instead of recomputing it), fixed placement does not (its own GPU
already holds the history; the pool only adds a small store cost).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import xxhash

from sim.deployment import emulated_deployment
from sim.driver import MODEL, Turn, chat_turn, text_of
from sim.profiles import get_profile


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


async def _session(client: httpx.AsyncClient, url: str, index: int, cfg: DemoConfig,
                   on_turn: Callable[[], None]) -> dict[str, Any]:
    seed = xxhash.xxh3_64_intdigest(f"{cfg.seed}/{index}".encode())
    messages = [{"role": "user", "content": text_of(seed, cfg.start_tokens)}]
    turns: list[Turn] = []
    start = time.perf_counter()
    for k in range(cfg.turns):
        turn, reply = await chat_turn(client, url, f"session-{index}", messages,
                                      output_tokens=cfg.output_tokens, time_scale=cfg.time_scale)
        turns.append(turn)
        on_turn()
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": text_of(seed + k + 1, cfg.added_tokens)}]
    total = (time.perf_counter() - start) / cfg.time_scale
    return {"session": index, "total_s": total, "turns": [asdict(t) for t in turns]}


async def run_configuration(cfg: DemoConfig, policy: str, pool_on: bool,
                            on_turn: Callable[[], None]) -> dict[str, Any]:
    """One (policy, pool) cell on fresh replicas, pool and router."""
    async with emulated_deployment(get_profile(cfg.profile), policy=policy, pool_on=pool_on,
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
    results = []
    for policy in cfg.policies:
        for pool_on in (False, True):
            results.append(await run_configuration(cfg, policy, pool_on, on_turn))
    by = {(r["policy"], r["pool"]): r["mean_session_s"] for r in results}
    gain = {p: 100.0 * (by[p, "on"] - by[p, "off"]) / by[p, "off"] for p in cfg.policies}
    return {
        "config": asdict(cfg),
        "units": "model seconds (wall seconds / time_scale)",
        "results": results,
        "session_change_with_pool_pct": gain,
        "wall_s": time.perf_counter() - began,
    }


def add_demo_options(parser: argparse.ArgumentParser) -> None:
    d = DemoConfig(policies=())
    parser.add_argument("--policies", default=None,
                        help="comma-separated policy names (default: every registered policy)")
    parser.add_argument("--profile", default=d.profile, help="replica model profile")
    parser.add_argument("--sessions", type=int, default=d.sessions, help="sessions per cell")
    parser.add_argument("--turns", type=int, default=d.turns)
    parser.add_argument("--start-tokens", type=int, default=d.start_tokens)
    parser.add_argument("--added-tokens", type=int, default=d.added_tokens)
    parser.add_argument("--output-tokens", type=int, default=d.output_tokens)
    parser.add_argument("--time-scale", type=float, default=d.time_scale,
                        help="wall seconds per model second")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--json", dest="json_path", default=None, help="write results here")
    parser.add_argument("--plot", dest="plot_path", default=None, help="write a PNG here")


def config_from_args(args: argparse.Namespace, known: Sequence[str]) -> DemoConfig:
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip()) \
        if args.policies else tuple(known)
    unknown = [p for p in policies if p not in known]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(known)}")
    return DemoConfig(policies=policies, profile=args.profile, sessions=args.sessions,
                      turns=args.turns, start_tokens=args.start_tokens,
                      added_tokens=args.added_tokens, output_tokens=args.output_tokens,
                      time_scale=args.time_scale, seed=args.seed)


def main(args: argparse.Namespace) -> int:
    """The CLI layer: progress bar, table, JSON and plot (sim.demo_report)."""
    import sys

    from policies import registry
    from sim.demo_report import print_table, progress, write_json, write_plot

    try:
        cfg = config_from_args(args, registry.names())
        get_profile(cfg.profile)
    except (KeyError, ValueError) as exc:
        print(f"lmroute demo: {exc}", file=sys.stderr)
        return 2
    total = len(cfg.policies) * 2 * cfg.sessions * cfg.turns
    with progress(total) as advance:
        result = asyncio.run(run_demo(cfg, advance))
    print_table(result)
    if args.json_path:
        write_json(result, args.json_path)
    if args.plot_path:
        write_plot(result, args.plot_path)
    return 0
