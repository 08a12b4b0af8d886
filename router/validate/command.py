"""``lmroute validate``: the command line of ``router.validate``.

    lmroute validate --target ROUTER_URL --admin-key KEY [options]
    lmroute validate --backend URL [--backend URL ...] [options]

Prints the table, writes ``--json``/``--plot`` when given, and exits 0 when every tier
passed, 1 when one failed (naming the tier and its first differing position), 2 on a bad
option or an unreachable deployment, 3 when inconclusive (a cache tier never hit a cache,
or a cold tier did).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from router.validate.config import DEFAULT_LENGTHS, DEFAULT_TOL, ValidateConfig


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x.lower().replace("k", "000")) for x in text.split(",") if x.strip())


def config_from(args: argparse.Namespace) -> ValidateConfig:
    """The run's config from parsed options; ``ValueError`` on a bad one."""
    return ValidateConfig(
        target=args.target, backends=tuple(args.backends or ()),
        admin_key=args.admin_key or os.environ.get("LMROUTE_ADMIN_KEY", ""), model=args.model,
        lengths=_ints(args.lengths), prompts=args.prompts, max_tokens=args.max_tokens,
        top_logprobs=args.top_logprobs, seed=args.seed, prompt_seed=args.prompt_seed,
        logprob_tol=args.logprob_tol,
        concurrency=args.concurrency, evict=args.evict, timeout_s=args.timeout_s)


async def _main(config: ValidateConfig, args: argparse.Namespace) -> int:
    from router.validate.client import Deployment, ValidateError
    from router.validate.report import print_table, write_json, write_png
    from router.validate.run import run_tiers

    try:
        async with Deployment(config) as dep:
            outcome = await run_tiers(config, dep)
    except ValidateError as exc:
        print(f"lmroute validate: {exc}", file=sys.stderr)
        return 2
    print_table(config, outcome)
    if args.json:
        write_json(Path(args.json), config, outcome)
    if args.plot:
        write_png(Path(args.plot), config, outcome)
    return outcome.exit_code


def _validate(args: argparse.Namespace) -> int:
    try:
        config = config_from(args)
    except ValueError as exc:
        print(f"lmroute validate: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_main(config, args))


def add_validate_command(sub: Any) -> None:
    val = sub.add_parser("validate", help="check that cached and pooled KV give the same "
                         "greedy replies as computing them (docs/validate.md)")
    val.add_argument("--target", help="a router's URL (its replicas are pinned per request)")
    val.add_argument("--backend", dest="backends", action="append",
                     help="a replica's URL (direct mode; repeat for each)")
    val.add_argument("--admin-key", help="the router's admin key (env LMROUTE_ADMIN_KEY)")
    val.add_argument("--model", help="model to ask for (default: the first listed)")
    val.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)),
                     help="prompt lengths in tokens, comma-separated (8k = 8000); those "
                          "over the context are skipped")
    val.add_argument("--prompts", type=int, default=4, help="prompts per length")
    val.add_argument("--max-tokens", type=int, default=16, help="K: output tokens compared")
    val.add_argument("--top-logprobs", type=int, default=2)
    val.add_argument("--seed", type=int, default=0, help="the requests' sampling seed")
    val.add_argument("--prompt-seed", type=int, default=None,
                     help="the prompts' generator (default: random per run; the report names it)")
    val.add_argument("--logprob-tol", type=float, default=DEFAULT_TOL,
                     help="largest |delta logprob| (nats) a healthy engine may show")
    val.add_argument("--concurrency", type=int, default=8,
                     help="requests in flight within a tier (1: one batch shape)")
    val.add_argument("--evict", action=argparse.BooleanOptionalAction, default=True,
                     help="run the evicted tier (resets every replica's GPU prefix cache)")
    val.add_argument("--timeout-s", type=float, default=300.0)
    val.add_argument("--json", help="write the report as JSON here")
    val.add_argument("--plot", help="write the report as a PNG here")
    val.set_defaults(func=_validate)
