"""The ``lmroute`` command.

    lmroute serve    --backend URL [--backend URL ...] [--policy NAME] [--config FILE] ...
    lmroute policies                                 list the registered routing policies
    lmroute validate --target URL --admin-key KEY    cached/pooled KV vs cold (docs/validate.md)

and, from ``sim/`` (``sim.cli.add_sim_commands``; they need the ``sim`` extra and are
absent without it, as in the router image):

    lmroute replica  --port N ...                    an emulated vLLM(+LMCache) replica
    lmroute demo     [--json PATH] [--plot PATH]     emulated replicas + router, policies compared
    lmroute sim      SCENARIO ...                    discrete-event simulation of the policies
    lmroute live     [--loads ...]                   rising load through the real router
    lmroute ab       --arms A,B ...                  A/B test two policies or deployments

Every ``serve`` option is also read from ``LMROUTE_<OPTION>`` and from the config file
(``--config`` or ``LMROUTE_CONFIG``); precedence CLI > env > file > default. Only this
module imports ``sim`` (to register its commands), and only for a command that is not the
router's own: the simulator's parsers import its experiments, and scipy with them, which
added about a second to every ``lmroute serve`` start-up and scipy and numpy to every
router process (``--workers`` forks them from the parent, which imported once). The
request path never imports it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from router.settings import SettingsError, field_help, load_settings


def _add_settings_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML or JSON settings file (env: LMROUTE_CONFIG)")
    for name, (typ, default, help_text) in field_help().items():
        flag = "--" + name.replace("_", "-")
        shown = ",".join(default) if isinstance(default, tuple) else default
        text = f"{help_text} (env LMROUTE_{name.upper()}; default: {shown!r})"
        if name == "backends":
            parser.add_argument("--backend", dest="backends", action="append", help=text)
        elif typ is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                default=None, help=text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=text)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from router.app import create_app

    config_file = args.config or os.environ.get("LMROUTE_CONFIG")
    try:
        settings = load_settings(vars(args), os.environ, config_file)
    except (SettingsError, OSError) as exc:
        print(f"lmroute: {exc}", file=sys.stderr)
        return 2
    if not settings.backends and not settings.backends_file:
        print("lmroute: at least one --backend URL (or --backends-file) is required",
              file=sys.stderr)
        return 2
    from router.logs import configure

    try:
        configure(settings.log_format, settings.log_level, settings.access_log)
        app = create_app(settings)
    except (ValueError, KeyError) as exc:
        print(f"lmroute: {exc}", file=sys.stderr)
        return 2
    if settings.workers < 1:
        print("lmroute: --workers must be at least 1", file=sys.stderr)
        return 2
    import socket

    from router.drain import DrainingServer
    from router.framing import JsonFramingProtocol
    from router.hotpath import freeze_gc

    # The replica's own Date/Server headers pass through: uvicorn must not add a second pair.
    # Malformed HTTP is answered OpenAI-shaped (router/framing.py). SIGTERM drains
    # (router/drain.py). Logging is router.logs' (log_config=None keeps uvicorn's hands off).
    # Idle client connections outlive the clients' own expiry (httpx 5 s, uvicorn's default
    # too): with equal timers a request sent as the router closes the connection is reset.
    config = uvicorn.Config(app, host=settings.host, port=settings.port,
                            log_config=None, log_level=settings.log_level, access_log=False,
                            server_header=False, date_header=False, http=JsonFramingProtocol,
                            proxy_headers=False,  # nothing reads the client address or scheme
                            timeout_graceful_shutdown=int(settings.drain_timeout_s),
                            timeout_keep_alive=settings.keep_alive_s)
    # Start-up's objects out of the collector's walk (router/hotpath.py); before a fork,
    # also what keeps the workers' copies of them shared.
    if settings.gc_freeze:
        freeze_gc(settings.gc_threshold0)

    def serve(sock: socket.socket | None) -> int:
        DrainingServer(config, app.state.drain, settings.drain_grace_s).run(
            sockets=[sock] if sock is not None else None)
        return 0

    if settings.workers == 1:
        return serve(None)
    from router.workers import serve_workers  # the app is built, not started: fork-safe

    return serve_workers(settings, serve)


def _policies(args: argparse.Namespace) -> int:
    from policies import registry

    print("\n".join(registry.all_names()))
    return 0


ROUTER_COMMANDS = frozenset({"serve", "policies", "validate"})


def build_parser(with_sim: bool = True) -> argparse.ArgumentParser:
    """Every command's parser; ``with_sim`` false: the router's own only."""
    parser = argparse.ArgumentParser(
        prog="lmroute", description="Locality-aware OpenAI-compatible router for vLLM replicas."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the router in front of replicas")
    _add_settings_options(serve)
    serve.set_defaults(func=_serve)
    pol = sub.add_parser("policies", help="list routing policies")
    pol.set_defaults(func=_policies)
    from router.validate.command import add_validate_command

    add_validate_command(sub)
    if not with_sim:
        return parser
    try:
        from sim.cli import add_sim_commands

        add_sim_commands(sub)
    except ImportError:  # the router alone (no `sim` extra, e.g. the image): serve, policies
        pass
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(with_sim=not argv or argv[0] not in ROUTER_COMMANDS)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
