"""Every ``lmroute`` subcommand of the simulator: ``replica``, ``demo``, ``live``, ``sim``, ``ab``.

Kept in sim/ so the router package never imports the simulator; ``router.cli`` only calls
``add_sim_commands(subparsers)``. Printing and exit codes happen only here: a bad option
(unknown policy or profile, unreadable file, invalid design) prints one line on stderr
and exits 2.

- ``replica``: one emulated vLLM(+LMCache) replica (``sim.emulator.command``).
- ``sim SCENARIO``: a discrete-event scenario (``sim.experiments.scenarios``/``reproduce``),
  a markdown table, JSON and PNG; ``sim gauntlet``: ``sim.experiments.gauntlet_cli``.
- ``demo``, ``live``, ``ab``: emulated replicas and the real router over HTTP
  (``sim.experiments.demo``/``live``/``ab``).

``--profile NAME|PATH`` (every command): a built-in profile name or a TOML/JSON file
(``sim.replica.profiles.load_profile``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from sim.emulator.command import PROFILE_HELP, add_replica_command
from sim.emulator.command import fail as _fail

SCENARIOS = ("cross-replica", "sessions", "study", "load", "pool-pressure", "trace")


def _config(cls: Any, args: argparse.Namespace, **given: Any) -> Any:
    """``cls`` (a config dataclass) from the options named like its fields, plus ``given``."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{n: getattr(args, n) for n in names if hasattr(args, n) and n not in given}, **given)


def _policies(text: str | None) -> tuple[str, ...]:
    """Comma-separated policy names (default: every registered one); unknown ones raise."""
    from policies import registry

    known = registry.names()
    chosen = tuple(p.strip() for p in (text or ",".join(known)).split(",") if p.strip())
    unknown = [p for p in chosen if p not in known]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(known)}")
    return chosen


# --- demo and live -------------------------------------------------------------------

def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from sim.experiments import demo, report
    from sim.replica.profiles import load_profile

    try:
        cfg = _config(demo.DemoConfig, args, policies=_policies(args.policies))
        load_profile(cfg.profile)
    except (KeyError, ValueError) as exc:
        return _fail("demo", exc)
    total = len(cfg.policies) * 2 * cfg.sessions * cfg.turns
    with report.progress_bar("demo", total) as bar:
        result = asyncio.run(demo.run_demo(cfg, bar.tick))
    Console().print(demo.build_table(result))
    if args.json_path:
        report.write_json(result, args.json_path)
    if args.plot_path:
        demo.write_plot(result, args.plot_path)
    return 0


def _live(args: argparse.Namespace) -> int:
    from sim.experiments import live, report
    from sim.replica.profiles import load_profile

    try:
        cfg = _config(live.LiveConfig, args, policies=_policies(args.policies),
                      loads=tuple(float(x) for x in args.loads.split(",") if x), pool=args.pool == "on")
        load_profile(cfg.profile)
    except (KeyError, ValueError) as exc:
        return _fail("live", exc)
    total = len(cfg.loads) * len(cfg.policies) * cfg.sessions * cfg.turns
    with report.progress_bar("live load", total) as bar:
        doc = asyncio.run(live.run_live(cfg, bar.tick))
    print(live.table(doc))
    if cfg.kill_at is not None:
        doc["failover"] = live.failover_summary(doc)
        for row in doc["failover"]:
            print(row)
    print(f"wall time {doc['wall_s']:.0f} s")
    if args.json_path:
        report.write_json(doc, args.json_path)
    if args.plot_path:
        live.plot(doc, args.plot_path)
    return 0


def _add_outputs(p: argparse.ArgumentParser, what: str = "results") -> None:
    p.add_argument("--json", dest="json_path", default=None, help=f"write the {what} here")
    p.add_argument("--plot", dest="plot_path", default=None, help="write a PNG here")


def _add_demo(sub: Any) -> None:
    from sim.experiments.demo import DemoConfig

    d = DemoConfig(policies=())
    p = sub.add_parser("demo", help="emulated replicas + router: policies x pool on/off")
    p.add_argument("--policies", default=None,
                   help="comma-separated policy names (default: every registered policy)")
    p.add_argument("--profile", default=d.profile, help=PROFILE_HELP)
    p.add_argument("--sessions", type=int, default=d.sessions, help="sessions per cell")
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--start-tokens", type=int, default=d.start_tokens)
    p.add_argument("--added-tokens", type=int, default=d.added_tokens)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help="wall seconds per model second")
    p.add_argument("--seed", type=int, default=d.seed)
    _add_outputs(p)
    p.set_defaults(func=_demo)


def _add_live(sub: Any) -> None:
    from sim.experiments.live import LiveConfig

    d = LiveConfig(policies=())
    p = sub.add_parser("live", help="emulated replicas + router: policies under rising load")
    p.add_argument("--policies", default=None,
                   help="comma-separated policies (default: every registered policy)")
    p.add_argument("--loads", default=",".join(str(x) for x in d.loads),
                   help="session arrival rates, sessions per model second")
    p.add_argument("--replicas", type=int, default=d.replicas)
    p.add_argument("--pool", choices=("on", "off"), default="on")
    p.add_argument("--sessions", type=int, default=d.sessions, help="sessions per cell")
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--min-start-tokens", type=int, default=d.min_start_tokens)
    p.add_argument("--max-start-tokens", type=int, default=d.max_start_tokens)
    p.add_argument("--added-tokens", type=int, default=d.added_tokens)
    p.add_argument("--think-s", type=float, default=d.think_s)
    p.add_argument("--time-scale", type=float, default=d.time_scale)
    p.add_argument("--profile", default=d.profile, help=PROFILE_HELP)
    p.add_argument("--kill-at", type=float, default=None,
                   help="stop replica 0 at this model second of every cell")
    p.add_argument("--seed", type=int, default=d.seed)
    _add_outputs(p)
    p.set_defaults(func=_live)


# --- sim -----------------------------------------------------------------------------

def _run_scenario(args: argparse.Namespace) -> Any:
    from sim.des.trace import load_trace
    from sim.experiments import reproduce, scenarios
    from sim.experiments.report import progress_bar
    from sim.replica.profiles import load_profile

    profile = load_profile(args.profile)
    common: dict[str, Any] = {"policies": args.policy, "seed": args.seed, "oracle": args.oracle}
    with progress_bar() as progress:
        common["progress"] = progress
        if args.scenario == "study":
            return reproduce.run_study(profile, seed=args.seed, progress=progress)
        if args.scenario == "cross-replica":
            return scenarios.cross_replica(profile, reps=args.reps or 8, **common)
        if args.scenario == "sessions":
            return scenarios.sessions(profile, reps=args.reps or 8, **common)
        sweep: dict[str, Any] = {"replicas": args.replicas or 4}
        if args.duration:
            sweep["duration_s"] = args.duration
        if args.scenario == "load":
            if args.load:
                sweep["loads"] = args.load
            return scenarios.load(profile, **sweep, **common)
        if args.scenario == "pool-pressure":
            if args.load:
                sweep["load"] = args.load[0]
            if args.pool_gib:
                sweep["pool_gib"] = args.pool_gib
            return scenarios.pool_pressure(profile, **sweep, **common)
        records = load_trace(args.file, args.limit)
        return scenarios.trace(profile, records, replicas=args.replicas or 8,
                               time_scale=args.time_scale, source=args.file, **common)


def _sim(args: argparse.Namespace) -> int:
    from policies.registry import UnknownPolicy
    from sim.des.trace import TraceFormatError
    from sim.experiments.sim_report import markdown, plot, write_json

    if args.scenario == "trace" and not args.file:
        return _fail("sim", ValueError("trace: a trace FILE is required"))
    try:
        result = _run_scenario(args)
    except (UnknownPolicy, KeyError, ValueError, OSError, TraceFormatError) as exc:
        return _fail("sim", exc)
    print(markdown(result))
    speed = [r["sim_requests_per_s"] for r in result.rows if r.get("sim_requests_per_s")]
    if speed:
        print(f"simulated requests per CPU second: min {min(speed):,.0f}, max {max(speed):,.0f}")
    if args.json_path:
        write_json(result, args.json_path)
    if args.plot_path:
        plot(result, args.plot_path)
    return 0


def _add_sim(sub: Any) -> None:
    top = sub.add_parser(
        "sim", help="discrete-event simulation of policies on replica models (the study and beyond)")
    scenarios = top.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    p = argparse.ArgumentParser(add_help=False)  # what every scenario but the gauntlet takes
    p.add_argument("file", nargs="?", default=None,
                   help="trace: Mooncake-format JSONL (.gz too), or mooncake, mooncake-synthetic")
    p.add_argument("--replicas", type=int, default=None,
                   help="replicas (load, pool-pressure: 4; trace: 8; study scenarios: 2)")
    p.add_argument("--policy", action="append", default=None,
                   help="policy, repeatable: NAME or NAME@KEY=VALUE (e.g. locality@prior=F.toml); "
                        "+oracle: ground-truth residency; +oracle-prior: the profile as prior")
    p.add_argument("--oracle", action="store_true", help="add a +oracle twin of every policy")
    p.add_argument("--seed", type=int, default=0)
    _add_outputs(p, "result document")
    p.add_argument("--profile", default="study-27b", help=PROFILE_HELP)
    p.add_argument("--reps", type=int, default=None, help="repetitions (cross-replica, sessions)")
    p.add_argument("--load", type=float, action="append", default=None,
                   help="sessions/min/replica, repeatable (load; pool-pressure takes the first)")
    p.add_argument("--pool-gib", type=float, action="append", default=None,
                   help="pool capacities to sweep, repeatable (pool-pressure)")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (load sweeps)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="trace: divide inter-arrival times by this (2 = twice the load)")
    p.add_argument("--limit", type=int, default=None, help="trace: replay only the first N")
    for name in SCENARIOS:
        scenarios.add_parser(name, parents=[p], help="docs/study.md").set_defaults(func=_sim)
    from sim.experiments.gauntlet_cli import add_gauntlet  # its own options
    add_gauntlet(scenarios)


# --- ab ------------------------------------------------------------------------------

def _ab_config(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from sim.experiments.ab import AbConfig

    if args.resume:
        doc: dict[str, Any] = json.loads(Path(args.resume).read_text(encoding="utf-8"))
        return AbConfig.from_json(doc["config"]), doc
    if not args.arms:
        raise ValueError("--arms A,B is required (or --resume PATH)")
    return _config(AbConfig, args), None


def _ab(args: argparse.Namespace) -> int:
    from sim.experiments import report
    from sim.experiments.ab import run_ab
    from sim.experiments.ab_report import markdown, plot
    from sim.experiments.ab_report import report as analysed
    from sim.replica.profiles import load_profile

    try:
        cfg, resumed = _ab_config(args)
        cfg.validate()
        if cfg.emulated:
            load_profile(cfg.profile)
    except (ValueError, OSError, KeyError) as exc:
        return _fail("ab", exc)
    json_path = args.json_path or args.resume

    def save(doc: dict[str, Any]) -> None:
        if json_path:
            report.write_json(doc, json_path)

    total = cfg.blocks * cfg.sessions_per_block * cfg.turns
    with report.progress_bar("ab", total, len(resumed["turns"]) if resumed else 0) as bar:
        try:
            doc = asyncio.run(run_ab(cfg, admin_key=args.admin_key, resume=resumed, save=save,
                                     on_turn=bar.tick))
        except (ValueError, RuntimeError, OSError) as exc:
            print(f"lmroute ab: {exc}", file=sys.stderr)
            return 1
    doc = analysed(doc, cfg.seed)
    print(markdown(doc))
    save(doc)
    if args.plot_path:
        plot(doc, args.plot_path)
    return 0


def _add_ab(sub: Any) -> None:
    from sim.experiments.ab import AbConfig

    d = AbConfig(arms="")
    p = sub.add_parser("ab", help="A/B test two routing policies (or deployments) on live traffic")
    p.add_argument("--arms", help="two arms A,B: POLICY[@KEY=VALUE...], e.g. fixed,round_robin "
                                  "or alternating@pool=off,alternating@pool=on")
    p.add_argument("--target", default="", help="router base URL (a real deployment)")
    p.add_argument("--emulated", action="store_true",
                   help="start two emulated replicas sharing a pool and a router here")
    p.add_argument("--pool", default=d.pool, help="emulated pool on|off (arms may override)")
    p.add_argument("--design", default=d.design, help="abba | interleaved")
    p.add_argument("--blocks", type=int, default=d.blocks)
    p.add_argument("--sessions-per-block", type=int, default=d.sessions_per_block)
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--min-start-tokens", type=int, default=d.min_start_tokens)
    p.add_argument("--max-start-tokens", type=int, default=d.max_start_tokens)
    p.add_argument("--added-tokens", type=int, default=d.added_tokens)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens,
                   help="reply length (a cap in trace mode)")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="sessions in flight at once")
    p.add_argument("--profile", default=d.profile, help="emulated " + PROFILE_HELP)
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help="emulated: wall seconds per model second")
    p.add_argument("--trace", default="",
                   help="Mooncake-format JSONL trace: a path, or mooncake, mooncake-synthetic")
    p.add_argument("--model", default=d.model, help="model name sent in requests")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--admin-key", default=os.environ.get("LMROUTE_ADMIN_KEY", ""),
                   help="the router's admin key (env LMROUTE_ADMIN_KEY; emulated: generated)")
    _add_outputs(p, "document")
    p.add_argument("--resume", default=None, help="continue the run saved in this JSON")
    p.set_defaults(func=_ab)


def add_sim_commands(sub: Any) -> None:
    """Register ``replica`` (the router's dependencies suffice: the router image runs it),
    then ``demo``, ``live``, ``sim`` and ``ab``, which import the ``sim`` extra: without it
    they raise ImportError, which ``router.cli`` takes as "not installed"."""
    for add in (add_replica_command, _add_demo, _add_live, _add_sim, _add_ab):
        add(sub)
