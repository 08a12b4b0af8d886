"""The ``lmroute`` subcommands that run the emulator: ``replica`` and ``demo``.

Kept in sim/ so the router package never imports the simulator; ``router.cli`` only
registers these parsers.

``replica --profile constant`` (the default) answers after the fixed ``--ttft``/``--tpot``;
any other profile (``study-27b``, ``tiny``) runs the replica model with a GPU prefix cache,
a pool (``--pool off|local|NAME``) and, with ``--kv-events-endpoint``, vLLM-format KV
events from a ZMQ PUB socket bound there.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

DEFAULT_MODEL = "emulated-27b"


def _replica(args: argparse.Namespace) -> int:
    import uvicorn

    from sim.deployment import PoolRegistry, close_replica, model_replica
    from sim.profiles import get_profile
    from sim.server import ConstantEngine, EmulatedReplica, Faults, create_replica_app

    faults = Faults(corrupt_pool=args.corrupt_pool)
    if args.profile == "constant":
        if args.kv_events_endpoint:
            print("lmroute replica: --kv-events-endpoint needs a model --profile", file=sys.stderr)
            return 2
        replica = EmulatedReplica(model=args.model, engine=ConstantEngine(args.ttft, args.tpot),
                                  time_scale=args.time_scale, fixed_created=args.fixed_created,
                                  faults=faults)
    else:
        try:
            profile = get_profile(args.profile)
            pool = PoolRegistry().resolve(args.pool, profile)
            replica = model_replica(
                args.name, profile, pool, model=args.model, time_scale=args.time_scale,
                block_size=args.block_size, kv_events_endpoint=args.kv_events_endpoint,
                kv_events_topic=args.kv_events_topic, faults=faults,
                fixed_created=args.fixed_created)
        except (KeyError, ValueError) as exc:
            print(f"lmroute replica: {exc}", file=sys.stderr)
            return 2
    try:
        uvicorn.run(create_replica_app(replica), host=args.host, port=args.port,
                    log_level=args.log_level, access_log=False)
    finally:
        close_replica(replica)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from sim.demo import main as demo_main

    return demo_main(args)


def add_sim_commands(sub: Any) -> None:
    rep = sub.add_parser("replica", help="serve an emulated vLLM(+LMCache) replica")
    rep.add_argument("--port", type=int, required=True)
    rep.add_argument("--host", default="127.0.0.1")
    rep.add_argument("--name", default="replica", help="replica name (metrics, events)")
    rep.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    rep.add_argument("--profile", default="constant",
                     help="timing: 'constant' (--ttft/--tpot) or a model profile "
                          "(study-27b, tiny)")
    rep.add_argument("--pool", default="local",
                     help="shared pool: off, local, or a name shared in this process")
    rep.add_argument("--block-size", type=int, default=16,
                     help="engine block size of GPU KV events (divides the profile's chunk)")
    rep.add_argument("--kv-events-endpoint", default=None,
                     help="bind a ZMQ PUB socket here for KV events, e.g. tcp://127.0.0.1:5557")
    rep.add_argument("--kv-events-topic", default="kv-events")
    rep.add_argument("--corrupt-pool", action="store_true",
                     help="fault: replies that loaded KV from the pool come out wrong")
    rep.add_argument("--time-scale", type=float, default=1.0,
                     help="wall seconds per model second (0.01: a 31.7 s prefill takes 0.317 s)")
    rep.add_argument("--ttft", type=float, default=0.0, help="constant TTFT, model seconds")
    rep.add_argument("--tpot", type=float, default=0.0,
                     help="constant time per output token, model seconds")
    rep.add_argument("--fixed-created", type=int, default=None,
                     help="constant 'created' timestamp (byte-reproducible replies)")
    rep.add_argument("--log-level", default="warning")
    rep.set_defaults(func=_replica)

    from sim.demo import add_demo_options

    demo = sub.add_parser("demo", help="emulated replicas + router: policies x pool on/off")
    add_demo_options(demo)
    demo.set_defaults(func=_demo)

    from sim.live_report import add_live_options
    from sim.live_report import main as live_main

    live = sub.add_parser("live", help="emulated replicas + router: policies under rising load")
    add_live_options(live)
    live.set_defaults(func=live_main)

    from sim.sim_cli import add_sim_command

    add_sim_command(sub)

    from sim.ab_report import add_ab_options
    from sim.ab_report import main as ab_main

    ab = sub.add_parser("ab", help="A/B test two routing policies (or deployments) on live traffic")
    add_ab_options(ab)
    ab.set_defaults(func=ab_main)
