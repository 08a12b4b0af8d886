"""Run in the vLLM venv: parse each argv given as JSON on stdin with `vllm serve`'s own
argument parser and print, per argv, the parsed values the deployment relies on.

Input: a JSON list of argv lists (the model first, as `vllm serve MODEL ...`). Output: a
JSON list of {"model", "port", "prefix_caching", "prompt_tokens_details", "kv_connector",
"kv_role", "kv_events": {...}} (None for a config not given) or {"error": "..."} when the parser
refuses an argv.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from vllm.entrypoints.cli.serve import ServeSubcommand

try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # older vLLM
    from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]


def parse(argv: list[str]) -> dict[str, object]:
    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="command"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(["serve", *argv])
    except SystemExit:
        return {"error": err.getvalue().strip()}
    events, transfer = args.kv_events_config, args.kv_transfer_config
    return {"model": args.model_tag, "port": args.port,
            "prefix_caching": bool(args.enable_prefix_caching),
            "prompt_tokens_details": bool(args.enable_prompt_tokens_details),
            "kv_connector": transfer.kv_connector if transfer else None,
            "kv_role": transfer.kv_role if transfer else None,
            "kv_events": {"enabled": events.enable_kv_cache_events,
                          "publisher": events.publisher, "endpoint": events.endpoint,
                          "topic": events.topic} if events else None}


if __name__ == "__main__":
    print(json.dumps([parse(argv) for argv in json.load(sys.stdin)]))
