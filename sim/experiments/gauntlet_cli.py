"""``lmroute sim gauntlet``: options, the ``--quick`` subset, and the command.

``add_gauntlet(scenarios)`` registers the subcommand on ``lmroute sim``'s scenario
subparsers; ``sim.cli`` calls it. Imports of the simulator and numpy happen in the
command, not at parser build time (``lmroute --help`` stays light).

``--quick`` (under 5 minutes on 2 cores): workloads agents, docqa and long; policies
locality, least_loaded, prefix_affinity and load_aware; hardware study-27b and
pool-4x-slower; 4 replicas, 1 router; loads 0.5, 1, 1.5 x knee; 2 seeds; 300 s of
arrivals; 2 bisection steps. An explicit option overrides its quick default.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

QUICK: dict[str, Any] = {
    "workloads": "agents,docqa,long", "policies": "locality,least_loaded,prefix_affinity,load_aware",
    "hardware": "study-27b,pool-4x-slower", "replicas": "4", "routers": "1",
    "loads": "0.5,1,1.5", "seeds": 2, "duration": 300.0, "knee_iters": 2,
}
FULL: dict[str, Any] = {
    "workloads": "mooncake,mooncake-synthetic,agents,docqa,tenants,bursty,long", "policies": "",
    "hardware": "study-27b,prefill-0.33x,prefill-3x,attn-3x,pool-4x-slower,small-gpu,no-pool,hetero,"
                "h200-27b,batched",
    "replicas": "2,4,8,16", "routers": "1,4", "loads": "0.25,0.5,0.75,1,1.25,1.5", "seeds": 3,
    "duration": 900.0, "knee_iters": 3,
}


def _split(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _knees(items: list[str] | None) -> tuple[tuple[str, float], ...]:
    out = []
    for item in items or []:
        name, _, value = item.partition("=")
        out.append((name.strip(), float(value)))
    return tuple(out)


def _knees_from(path: str | None, given: tuple[tuple[str, float], ...]
                ) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float, float], ...]]:
    """``given`` plus the knees of an earlier run's JSON (``--knees-from``), with their
    light-load p90 and SLO (for capacity); ``--knee`` wins over the file."""
    if not path:
        return given, ()
    import orjson

    with open(path, "rb") as f:
        doc = orjson.loads(f.read())
    named = dict(given)
    try:
        recorded: dict[str, dict[str, Any]] = doc["knees"]
        knees = list(given) + [(w, float(k["rate_scale"])) for w, k in recorded.items()
                               if w not in named]
        slos = tuple((w, float(k["light_p90_s"]), float(k["slo_p90_s"]))
                     for w, k in recorded.items()
                     if w not in named and k.get("slo_p90_s") is not None)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"--knees-from {path}: not a gauntlet JSON with knees ({exc!r})") from exc
    return tuple(knees), slos


def config(args: argparse.Namespace) -> Any:
    """The ``GauntletConfig`` of parsed options (quick or full defaults where not given)."""
    from sim.experiments.gauntlet import GauntletConfig, default_jobs

    d = QUICK if args.quick else FULL
    pick = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in d.items()}
    knees, slos = _knees_from(args.knees_from, _knees(args.knee))
    return GauntletConfig(
        workloads=_split(pick["workloads"]), policies=_split(pick["policies"]),
        hardware=_split(pick["hardware"]), replicas=tuple(int(x) for x in _split(pick["replicas"])),
        routers=tuple(int(x) for x in _split(pick["routers"])),
        loads=tuple(float(x) for x in _split(pick["loads"])), seeds=int(pick["seeds"]),
        duration_s=float(pick["duration"]), base_profile=args.profile,
        oracle_prior=args.oracle_prior, knee_iters=int(pick["knee_iters"]),
        knees=knees, knee_slos=slos, shared_index=args.shared_index,
        jobs=args.jobs if args.jobs else default_jobs())


def command(args: argparse.Namespace) -> int:
    """Run the gauntlet; print markdown; write JSON and the heat map if asked."""
    import dataclasses

    from policies.registry import UnknownPolicy
    from sim.experiments import gauntlet_report, report
    from sim.experiments.gauntlet import run_gauntlet

    try:
        cfg = config(args)
        cfg.validate()
    except (UnknownPolicy, KeyError, ValueError, OSError) as exc:
        print(f"lmroute sim: {exc}", file=sys.stderr)
        return 2
    with report.progress_bar("gauntlet") as bar:
        run = run_gauntlet(cfg, progress=bar)
    params = {**dataclasses.asdict(cfg), "quick": bool(args.quick)}
    params["knees"] = [list(k) for k in cfg.knees]
    params["knee_slos"] = [list(k) for k in cfg.knee_slos]
    doc = gauntlet_report.document(params, run)
    print(gauntlet_report.markdown(doc))
    print(f"wall time {run['wall_s']:.0f} s")
    if args.json_path:
        report.write_json(doc, args.json_path)
    if args.plot_path:
        gauntlet_report.heatmap(doc, args.plot_path)
    return 0


def add_gauntlet(scenarios: Any) -> None:
    """Register ``gauntlet`` on the ``sim`` scenario subparsers."""
    p = scenarios.add_parser(
        "gauntlet", help="every policy over workloads x loads (relative to each knee), "
                         "hardware, fleet sizes and router counts")
    lists = {"workloads": "workload generators", "policies": "policies (default: every one)",
             "hardware": "hardware rows", "replicas": "fleet sizes", "routers": "router counts",
             "loads": "load multipliers of the knee"}
    for name, what in lists.items():
        p.add_argument(f"--{name}", default=None,
                       help=f"comma-separated {what} (full: {FULL[name] or 'all'})")
    p.add_argument("--seeds", type=int, default=None, help="seeds per cell (full 3, quick 2)")
    p.add_argument("--duration", type=float, default=None,
                   help="simulated seconds of arrivals per run (full 900, quick 300)")
    p.add_argument("--knee-iters", type=int, default=None, help="bisection steps of the knee")
    p.add_argument("--knee", action="append", default=None, metavar="WORKLOAD=SCALE",
                   help="a known knee (rate scale): skip its search; repeatable")
    p.add_argument("--knees-from", default=None, metavar="JSON",
                   help="an earlier run's knees and SLOs (its JSON): skip their search, keep "
                        "capacity; --knee wins")
    p.add_argument("--quick", action="store_true", help="a small subset (< 5 min on 2 cores)")
    p.add_argument("--oracle-prior", action="store_true",
                   help="add a locality+oracle-prior arm (the profile as its prior)")
    p.add_argument("--shared-index", action="store_true",
                   help="several routers share one prefix index (as with --index redis://); "
                        "default: each router its own")
    p.add_argument("--profile", default="study-27b",
                   help="base hardware the rows derive from (a built-in name or a file)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: <= 2)")
    p.add_argument("--json", dest="json_path", default=None, help="write the document here")
    p.add_argument("--plot", dest="plot_path", default=None, help="write the heat map PNG here")
    p.set_defaults(func=command)
