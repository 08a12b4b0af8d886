"""Benchmark: what lmroute costs in front of a replica, against direct access.

The same set-up as ``upstream_clients.py`` (whose helpers it reuses): the fast raw-asyncio
fake backend (``fake_backend.py``) pinned to core 1, the router under test pinned to core 0
(one core, as the peer routers' published figures), wrk on core 1 (core 0 for the direct
run). For each target: ``wrk -t2 -c64`` for max req/s and ``wrk -t1 -c1`` for latency at
low load, non-streamed and streamed (16-token replies). The router runs each policy given
with ``--policies``; its full request path runs (parse, prefix hashing, index lookup and
record, policy, metrics). Added latency = router p50/p99 minus direct p50/p99.

Usage::

    .venv/bin/python bench/router_bench.py [--policies round_robin prefix_affinity]
        [--rounds 1] [--duration 10] [--json out/router_bench.json]

Needs ``wrk`` and ``taskset`` (Debian: wrk, util-linux). Everything it starts is stopped.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from upstream_clients import (
    BACKEND_CPU,
    BODY,
    HOST,
    LUA_TEMPLATE,
    PROXY_CPU,
    WrkResult,
    check_replies,
    free_port,
    measure_target,
    started,
)

HERE = Path(__file__).resolve().parent


def table(results: list[WrkResult]) -> str:
    def one(target: str, mode: str, load: str) -> list[WrkResult]:
        return [r for r in results if (r.target, r.mode, r.load) == (target, mode, load)]

    def med(rs: list[WrkResult], attr: str) -> float:
        values = sorted(getattr(r, attr) for r in rs)
        return values[len(values) // 2] if values else float("nan")

    lines = [
        "| target | req/s non-stream | req/s stream | c1 p50/p99 ms non-stream "
        "| c1 p50/p99 ms stream | added c1 p50/p99 ms non-stream | added c1 p50/p99 ms stream |",
        "|---|---|---|---|---|---|---|",
    ]
    targets = list(dict.fromkeys(r.target for r in results))
    for t in targets:
        cells = [t]
        for mode in ("non-stream", "stream"):
            cells.append(f"{med(one(t, mode, 'c64'), 'rps'):,.0f}")
        for mode in ("non-stream", "stream"):
            rs = one(t, mode, "c1")
            cells.append(f"{med(rs, 'p50_ms'):.2f} / {med(rs, 'p99_ms'):.2f}")
        for mode in ("non-stream", "stream"):
            rs, ds = one(t, mode, "c1"), one("direct", mode, "c1")
            if t == "direct" or not ds:
                cells.append("-")
                continue
            cells.append(f"{med(rs, 'p50_ms') - med(ds, 'p50_ms'):+.2f} / "
                         f"{med(rs, 'p99_ms') - med(ds, 'p99_ms'):+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="lmroute overhead against direct access")
    parser.add_argument("--policies", nargs="+", default=["round_robin", "prefix_affinity"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--duration", type=int, default=10, help="seconds per loaded run")
    parser.add_argument("--low-duration", type=int, default=5, help="seconds per c1 run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            print(f"{tool} not found on PATH (apt-get install wrk util-linux)", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    py = sys.executable
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results: list[WrkResult] = []
    with tempfile.TemporaryDirectory(prefix="router_bench_") as tmp:
        luas: dict[str, Path] = {}
        for mode, extra in (("non-stream", ""), ("stream", ',"stream":true')):
            luas[mode] = Path(tmp) / f"{mode}.lua"
            luas[mode].write_text(LUA_TEMPLATE % (BODY % extra))
        backend_port = free_port()
        backend = ["taskset", "-c", BACKEND_CPU, py, str(HERE / "fake_backend.py"),
                   "--host", HOST, "--port", str(backend_port)]
        with started(backend, backend_port, "fake backend"):
            check_replies(backend_port, "fake backend")
            for rnd in range(1, args.rounds + 1):
                results += measure_target("direct", backend_port, luas, rnd, args)
                for policy in args.policies:
                    port = free_port()
                    cmd = ["taskset", "-c", PROXY_CPU, py, "-m", "router.cli", "serve",
                           "--backend", f"http://{HOST}:{backend_port}", "--policy", policy,
                           "--host", HOST, "--port", str(port), "--drain-grace-s", "0"]
                    with started(cmd, port, f"lmroute ({policy})"):
                        check_replies(port, f"lmroute ({policy})")
                        results += measure_target(f"lmroute {policy}", port, luas, rnd, args)
    out = table(results)
    print()
    print(out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "started_at": started_at, "ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "results": [asdict(r) for r in results], "table": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
