"""The ``lmroute`` subcommands that run the emulator: ``replica`` (and later ``demo``, ``sim``).

Kept in sim/ so the router package never imports the simulator; ``router.cli`` only
registers these parsers.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_MODEL = "emulated-27b"


def _replica(args: argparse.Namespace) -> int:
    import uvicorn

    from sim.server import ConstantEngine, EmulatedReplica, create_replica_app

    engine = ConstantEngine(ttft_s=args.ttft, tpot_s=args.tpot)
    replica = EmulatedReplica(model=args.model, engine=engine, time_scale=args.time_scale,
                              fixed_created=args.fixed_created)
    uvicorn.run(create_replica_app(replica), host=args.host, port=args.port,
                log_level=args.log_level, access_log=False)
    return 0


def add_sim_commands(sub: Any) -> None:
    rep = sub.add_parser("replica", help="serve an emulated vLLM replica")
    rep.add_argument("--port", type=int, required=True)
    rep.add_argument("--host", default="127.0.0.1")
    rep.add_argument("--name", default="replica", help="replica name (metrics, events)")
    rep.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    rep.add_argument("--time-scale", type=float, default=1.0,
                     help="wall seconds per model second (0.01: a 31.7 s prefill takes 0.317 s)")
    rep.add_argument("--ttft", type=float, default=0.0, help="constant TTFT, model seconds")
    rep.add_argument("--tpot", type=float, default=0.0,
                     help="constant time per output token, model seconds")
    rep.add_argument("--fixed-created", type=int, default=None,
                     help="constant 'created' timestamp (byte-reproducible replies)")
    rep.add_argument("--log-level", default="warning")
    rep.set_defaults(func=_replica)
