"""``lmroute replica``: serve one emulated vLLM(+LMCache) replica.

``--profile constant`` (the default) answers after the fixed ``--ttft``/``--tpot``; any
other profile runs the replica model with a GPU prefix cache, a pool (``--pool
off|local|redis://HOST:PORT/DB|NAME``: the URL shares it across processes) and, with
``--kv-events-endpoint``, vLLM-format KV events from a ZMQ PUB socket bound there. A bad
option prints one line on stderr and exits 2 (``sim.cli``'s convention).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sim.emulator.corruption import DEFAULT_LOAD, DEFAULT_POSITION, MODES

DEFAULT_MODEL = "emulated-27b"
PROFILE_HELP = "replica profile: a built-in name (study-27b, h200-27b, tiny) or a .toml/.json file"


def fail(command: str, exc: BaseException) -> int:
    """One line on stderr, exit code 2: every simulator command's answer to a bad option."""
    print(f"lmroute {command}: {exc}", file=sys.stderr)
    return 2


def _replica(args: argparse.Namespace) -> int:
    import uvicorn

    from sim.emulator.deployment import PoolRegistry, close_replica, model_replica
    from sim.emulator.server import ConstantEngine, EmulatedReplica, Faults, create_replica_app
    from sim.replica.profiles import load_profile

    faults = Faults(corrupt_pool=args.corrupt_pool, corrupt_load=args.corrupt_load,
                    corrupt_position=args.corrupt_position)
    if args.profile == "constant":
        if args.kv_events_endpoint:
            return fail("replica", ValueError("--kv-events-endpoint needs a model --profile"))
        replica = EmulatedReplica(model=args.model, engine=ConstantEngine(args.ttft, args.tpot),
                                  time_scale=args.time_scale, fixed_created=args.fixed_created,
                                  faults=faults)
    else:
        try:
            profile = load_profile(args.profile)
            pool = PoolRegistry().resolve(args.pool, profile, args.time_scale)
            replica = model_replica(
                args.name, profile, pool, model=args.model, time_scale=args.time_scale,
                block_size=args.block_size, kv_events_endpoint=args.kv_events_endpoint,
                kv_events_topic=args.kv_events_topic, kv_events_pool_medium=args.kv_events_pool_medium,
                faults=faults, fixed_created=args.fixed_created)
        except (KeyError, ValueError) as exc:
            return fail("replica", exc)
    replica.max_model_len = args.max_model_len
    try:
        uvicorn.run(create_replica_app(replica), host=args.host, port=args.port,
                    log_level=args.log_level, access_log=False)
    finally:
        close_replica(replica)
    return 0


def add_replica_command(sub: Any) -> None:
    rep = sub.add_parser("replica", help="serve an emulated vLLM(+LMCache) replica")
    rep.add_argument("--port", type=int, required=True)
    rep.add_argument("--host", default="127.0.0.1")
    rep.add_argument("--name", default="replica", help="replica name (metrics, events)")
    rep.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    rep.add_argument("--profile", default="constant",
                     help="timing: 'constant' (--ttft/--tpot), or " + PROFILE_HELP)
    rep.add_argument("--pool", default="local",
                     help="shared pool: off, local, redis://HOST:PORT/DB (shared by every "
                          "replica process given it), or a name shared in this process")
    rep.add_argument("--block-size", type=int, default=16,
                     help="engine block size of GPU KV events (divides the profile's chunk)")
    rep.add_argument("--kv-events-endpoint", default=None,
                     help="bind a ZMQ PUB socket here for KV events, e.g. tcp://127.0.0.1:5557")
    rep.add_argument("--kv-events-topic", default="kv-events")
    rep.add_argument("--kv-events-pool-medium", default="cpu", help="pool events' medium: "
                     "'cpu' (LMCache: stores only), 'CPU' (vLLM's CPU offload, replica-local)")
    rep.add_argument("--corrupt-pool", nargs="?", const="all", default="off", choices=MODES,
                     help="fault: replies that loaded KV from the pool come out wrong: all "
                          "(the default with no MODE), load (only with --corrupt-load requests "
                          "in prefill), position (only loads past --corrupt-position), replica "
                          "(the chunks this replica writes are wrong for every reader)")
    rep.add_argument("--corrupt-load", type=int, default=DEFAULT_LOAD,
                     help="the 'load' mode's threshold: requests in prefill, this one included")
    rep.add_argument("--corrupt-position", type=int, default=DEFAULT_POSITION,
                     help="the 'position' mode's prompt position")
    rep.add_argument("--time-scale", type=float, default=1.0,
                     help="wall seconds per model second (0.01: a 31.7 s prefill takes 0.317 s)")
    rep.add_argument("--ttft", type=float, default=0.0, help="constant TTFT, model seconds")
    rep.add_argument("--tpot", type=float, default=0.0,
                     help="constant time per output token, model seconds")
    rep.add_argument("--fixed-created", type=int, default=None,
                     help="constant 'created' timestamp (byte-reproducible replies)")
    rep.add_argument("--max-model-len", type=int, default=1_048_576,
                     help="context length: prompt + max_tokens over it is a 400, as in vLLM")
    rep.add_argument("--log-level", default="warning")
    rep.set_defaults(func=_replica)
