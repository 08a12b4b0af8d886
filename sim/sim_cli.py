"""``lmroute sim SCENARIO``: run a simulator scenario, print a markdown table, save JSON/PNG.

    lmroute sim cross-replica | sessions | study | load | pool-pressure | trace FILE
        [--replicas N] [--policy NAME ...] [--oracle] [--seed N] [--json PATH] [--plot PATH]
        [--profile study-27b] [--reps N] [--load X ...] [--pool-gib G ...] [--duration S]
        [--time-scale X] [--limit N]

``--policy`` may repeat; default: every registered policy (``cross-replica``/``sessions``:
``fixed`` and ``alternating``; ``study`` always uses those two). ``NAME+oracle`` or
``--oracle`` adds the ground-truth residency twin. ``add_sim_command(subparsers)``
registers the parser; ``router.cli`` (via ``sim.cli``) calls it. Printing happens only here.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

SCENARIOS = ("cross-replica", "sessions", "study", "load", "pool-pressure", "trace")


class RichProgress:
    """A rich progress bar on stderr (the table goes to stdout)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[last]}"), console=Console(stderr=True),
                             transient=True)
        self._task: Any = None

    def __enter__(self) -> RichProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def start(self, total: int, what: str) -> None:
        self._task = self._bar.add_task(what, total=total, last="")

    def advance(self, label: str) -> None:
        self._bar.update(self._task, advance=1, last=label)


def _run(args: argparse.Namespace) -> Any:
    from sim import reproduce, scenarios
    from sim.profiles import get_profile
    from sim.trace import load_trace

    profile = get_profile(args.profile)
    common: dict[str, Any] = {"policies": args.policy, "seed": args.seed, "oracle": args.oracle}
    with RichProgress() as progress:
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


def _main(args: argparse.Namespace) -> int:
    from policies.registry import UnknownPolicy
    from sim.report import markdown, plot, write_json
    from sim.trace import TraceFormatError

    if args.scenario == "trace" and not args.file:
        print("lmroute sim trace: a trace FILE is required", file=sys.stderr)
        return 2
    try:
        result = _run(args)
    except (UnknownPolicy, KeyError, ValueError, OSError, TraceFormatError) as exc:
        print(f"lmroute sim: {exc}", file=sys.stderr)
        return 2
    print(markdown(result))
    speed = [r["sim_requests_per_s"] for r in result.rows if r.get("sim_requests_per_s")]
    if speed:
        print(f"simulated requests per CPU second: min {min(speed):,.0f}, max {max(speed):,.0f}")
    if args.json:
        write_json(result, args.json)
    if args.plot:
        plot(result, args.plot)
    return 0


def add_sim_command(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sim", help="discrete-event simulation of policies on replica models (the study and beyond)")
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("file", nargs="?", default=None, help="trace: a Mooncake-format JSONL file")
    p.add_argument("--replicas", type=int, default=None,
                   help="replicas (load, pool-pressure: 4; trace: 8; study scenarios: 2)")
    p.add_argument("--policy", action="append", default=None,
                   help="policy name, repeatable; NAME+oracle for the ground-truth twin")
    p.add_argument("--oracle", action="store_true", help="add a +oracle twin of every policy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the result document here")
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    p.add_argument("--profile", default="study-27b", help="replica timing profile")
    p.add_argument("--reps", type=int, default=None, help="repetitions (cross-replica, sessions)")
    p.add_argument("--load", type=float, action="append", default=None,
                   help="sessions/min/replica, repeatable (load; pool-pressure takes the first)")
    p.add_argument("--pool-gib", type=float, action="append", default=None,
                   help="pool capacities to sweep, repeatable (pool-pressure)")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (load sweeps)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="trace: divide inter-arrival times by this (2 = twice the load)")
    p.add_argument("--limit", type=int, default=None, help="trace: replay only the first N")
    p.set_defaults(func=_main)
    return p
