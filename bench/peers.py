"""Benchmark: lmroute against the Rust routers (sglang-router, vllm-router), side by side.

Every router runs in front of the same backends (``fake_backend.py``), all started once
and kept up for the whole run, so that the cells can be interleaved: for each round and
each measurement the targets run one after the other, in an order rotated every round,
and every figure is reported as a ratio to sglang-router ``cache_aware`` measured in the
same round (the noise of this shared machine hits neighbours alike).

Layout (2 cores): routers on core 0 (``taskset``; the Rust routers then size their runtime
to one core), the backends and wrk on core 1.

- fast backends (2, 16-token replies, all events in one burst): ``wrk -t2 -c64`` for
  non-streamed and streamed req/s, and router CPU per request (utime+stime of the router's
  process tree from /proc, before and after the run, over the requests wrk completed);
- paced backends (2, ``--events`` events ``--delay-ms`` apart, as an engine decodes):
  ``wrk -t2 -c<--paced-conns>`` on streams; the offered load is set by the pacing, so all
  routers carry the same events/s and CPU per SSE event (router CPU over events relayed)
  compares their cost directly;
- ``wrk -t1 -c1`` non-streamed on the fast backends, and directly at one of them: added
  latency p50/p99 = router minus direct, measured in the same round.

``--workers-policies P`` adds ``lmroute serve --workers N`` targets, all N workers pinned
to the router core with the rest: on a 2-core machine whose other core runs the load, the
scaling question is CPU per request (summed over the workers), not throughput.

``--compiled VENV`` adds ``lmroute P (mypyc)`` targets: that venv's ``lmroute``, whose
locality modules are compiled (``make fast``, setup.py), beside this checkout's pure one;
with ``--workers-policies``, also that build's ``--workers N`` targets.

Each cell also records the 1-minute load average and how busy core 0 was beyond the
router itself (``core0_other``: other processes on the router's core, the noise).

Usage (``make bench-peers`` installs the peers' venv and runs it)::

    .venv/bin/python bench/peers.py --peers-venv .venv-peers [--rounds 2]
        [--policies round_robin prefix_affinity locality] [--json out/bench-peers.json]
        [--plot out/bench-peers.png]

A peer whose command is missing from the venv is reported as absent, not faked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from peers_report import plot, ratios, table
from upstream_clients import (
    BODY,
    HOST,
    LUA_TEMPLATE,
    check_replies,
    free_port,
    run_wrk,
    started,
)

HERE = Path(__file__).resolve().parent
ROUTER_CPU, LOAD_CPU = "0", "1"
BASELINE = "sglang-router cache_aware"
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """utime+stime (all threads) of ``pid`` and its descendants, in seconds."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / TICK


def core_busy_s(cpu: str) -> float:
    """Seconds core ``cpu`` spent not idle since boot (from /proc/stat)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            v = [int(x) for x in line.split()[1:]]
            return (sum(v[:8]) - v[3] - v[4]) / TICK
    raise RuntimeError(f"cpu{cpu} not in /proc/stat")


SERVERS = ("granian", "hypercorn")


def server_cmd(server: str, port: int) -> list[str]:
    """``router.asgi``'s app on ``server`` (this venv's), one process and one
    thread for requests, uvloop, no access log, as ``lmroute serve`` runs uvicorn."""
    exe = str(Path(sys.executable).parent / server)
    if server == "granian":
        return [exe, "--interface", "asgi", "--loop", "uvloop", "--workers", "1",
                "--runtime-threads", "1", "--no-ws", "--log-level", "error",
                "--host", HOST, "--port", str(port), "router.asgi:app"]
    return [exe, "--worker-class", "uvloop", "--workers", "1", "--bind", f"{HOST}:{port}",
            "--log-level", "error", "router.asgi:app"]


def router_cmds(args: argparse.Namespace, port: int, backends: list[str]) -> dict[str, list[str]]:
    """target name -> command line, for the routers this run has."""
    pin = ["taskset", "-c", ROUTER_CPU]
    cmds: dict[str, list[str]] = {}
    venv = Path(args.peers_venv) / "bin"
    for peer in ("sglang-router", "vllm-router"):
        exe = venv / peer
        if not exe.exists():
            continue
        sub = ["launch"] if peer == "sglang-router" else []
        cmds[f"{peer} cache_aware"] = [
            *pin, str(exe), *sub, "--host", HOST, "--port", str(port), "--worker-urls", *backends,
            "--policy", "cache_aware", "--log-level", "error",
            "--prometheus-port", str(free_port()), "--prometheus-host", HOST]

    backend_args = [a for b in backends for a in ("--backend", b)]
    here = [sys.executable, "-m", "router.cli"]  # this checkout's lmroute

    def serve(entry: list[str], *options: str, after: Sequence[str] = ()) -> list[str]:
        """``entry serve`` with this run's backends, address and ``--lmroute-args``; ``after``
        comes last, so that it wins over those."""
        return [*pin, *entry, "serve", *backend_args, *options, "--host", HOST, "--port",
                str(port), "--drain-grace-s", "0", *args.lmroute_args, *after]

    if args.before:  # another checkout's lmroute (its own venv's entry point), same options
        for policy in args.before_policies:
            cmds[f"lmroute@before {policy}"] = serve(
                [str(Path(args.before) / ".venv" / "bin" / "lmroute")], "--policy", policy)
    compiled = [str(Path(args.compiled) / "bin" / "lmroute")] if args.compiled else None
    if compiled:  # the policies compiled by mypyc (make fast): that venv's entry point
        for policy in args.compiled_policies:
            cmds[f"lmroute {policy} (mypyc)"] = serve(compiled, "--policy", policy)
    workers = ("--workers", str(args.workers))
    for policy in args.workers_policies:  # N workers, all on the router core: CPU/request
        cmds[f"lmroute {policy} x{args.workers} workers"] = serve(here, "--policy", policy,
                                                                   *workers)
        if compiled:  # and the same with the compiled build, beside its one worker
            cmds[f"lmroute {policy} x{args.workers} workers (mypyc)"] = serve(
                compiled, "--policy", policy, *workers)
    for server in args.server:  # the same app on another ASGI server (router.asgi)
        for policy in args.server_policies:
            env = ["env", f"LMROUTE_BACKENDS={','.join(backends)}", f"LMROUTE_POLICY={policy}",
                   "LMROUTE_ACCESS_LOG=false"]
            cmds[f"lmroute {policy} on {server}"] = [*env, *pin, *server_cmd(server, port)]
    floor = [*pin, sys.executable, str(HERE / "raw_relay.py"), "--host", HOST, "--port",
             str(port), *backend_args]
    if args.floor:  # no router at all: the interpreter and uvloop relaying bytes
        cmds["python floor (uvloop byte relay)"] = floor
    if args.floor_workers:  # the same relay in N processes on the router's core
        cmds[f"python floor x{args.workers} workers"] = [*floor, "--workers", str(args.workers)]
    for variant in args.variant:  # NAME=ARGS: `lmroute serve ARGS` as target NAME
        name, _, extra = variant.partition("=")
        cmds[name] = serve(here, after=extra.split())
    for policy in args.policies:
        cmds[f"lmroute {policy}"] = serve(here, "--policy", policy)
    return cmds


def start_all(stack: ExitStack, args: argparse.Namespace, backends: list[str],
              tag: str) -> dict[str, tuple[int, int]]:
    """Start every router in front of ``backends``: name -> (port, pid)."""
    up: dict[str, tuple[int, int]] = {}
    for name in router_cmds(args, 0, backends):
        port = free_port()
        cmd = router_cmds(args, port, backends)[name]
        proc = stack.enter_context(started(cmd, port, f"{name} ({tag})"))
        if tag == "fast":
            check_replies(port, name)
        up[name] = (port, proc.pid)
    return up


def cell(kind: str, target: str, port: int, pid: int | None, lua: Path, rnd: int,
         conns: int, duration: int) -> dict[str, Any]:
    """One wrk run against ``port``, with the router's CPU and core 0's other load."""
    threads = 1 if conns == 1 else 2
    load = os.getloadavg()[0]
    cpu0, busy0, t0 = (tree_cpu_s(pid) if pid else 0.0), core_busy_s(ROUTER_CPU), time.monotonic()
    stats, cmd = run_wrk(port, lua, cpu=LOAD_CPU, threads=threads, conns=conns,
                         duration_s=duration)
    wall = time.monotonic() - t0
    cpu = (tree_cpu_s(pid) - cpu0) if pid else 0.0
    other = max(0.0, core_busy_s(ROUTER_CPU) - busy0 - cpu) / wall
    out = {"kind": kind, "target": target, "round": rnd, "conns": conns, **stats,
           "router_cpu_s": round(cpu, 3), "wall_s": round(wall, 2), "loadavg_before": load,
           "core0_other": round(other, 3), "command": cmd}
    print(f"  r{rnd} {kind:12s} {target:30s} {stats['rps']:9.0f} req/s p50 {stats['p50_ms']:6.2f}"
          f" p99 {stats['p99_ms']:7.2f} ms cpu {cpu:5.2f}s err {stats['errors']:.0f}"
          f" load {load:.2f} core0-other {other:.2f}", flush=True)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    py = sys.executable
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="peers_") as tmp, ExitStack() as stack:
        luas = {}
        for mode, extra in (("non-stream", ""), ("stream", ',"stream":true')):
            luas[mode] = Path(tmp) / f"{mode}.lua"
            luas[mode].write_text(LUA_TEMPLATE % (BODY % extra))
        fast, paced = [free_port(), free_port()], [free_port(), free_port()]
        for port in fast + paced:
            delay = args.delay_ms / 1000 if port in paced else 0.0
            tokens = args.events if port in paced else 16
            cmd = ["taskset", "-c", LOAD_CPU, py, str(HERE / "fake_backend.py"), "--host", HOST,
                   "--port", str(port), "--tokens", str(tokens), "--token-delay", str(delay)]
            stack.enter_context(started(cmd, port, f"backend {port}"))
        urls = lambda ports: [f"http://{HOST}:{p}" for p in ports]  # noqa: E731
        on_fast = start_all(stack, args, urls(fast), "fast")
        on_paced = start_all(stack, args, urls(paced), "paced")
        names = list(on_fast)
        for rnd in range(1, args.rounds + 1):
            order = names[rnd - 1:] + names[:rnd - 1]  # rotate: no target always first
            print(f"round {rnd}/{args.rounds}: {', '.join(order)}", flush=True)
            for name in order:  # warm-up: pools and code paths hot
                run_wrk(on_fast[name][0], luas["non-stream"], cpu=LOAD_CPU, threads=2,
                        conns=64, duration_s=1)
            for kind, where, mode, conns, dur in (
                ("nonstream", on_fast, "non-stream", 64, args.duration),
                ("stream", on_fast, "stream", 64, args.duration),
                ("paced", on_paced, "stream", args.paced_conns, args.duration),
                ("c1", on_fast, "non-stream", 1, args.low_duration),
            ):
                if args.only and kind not in args.only:
                    continue
                if kind == "c1":
                    cells.append(cell(kind, "direct", fast[0], None, luas[mode], rnd, 1, dur))
                for name in order:
                    port, pid = where[name]
                    cells.append(cell(kind, name, port, pid, luas[mode], rnd, conns, dur))
    # (Before the thirty-second session "started_at" was written here, at the end.)
    return {"started_at": started_at, "ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0], "events_per_paced_stream": args.events + 1,
            "paced_delay_ms": args.delay_ms, "paced_conns": args.paced_conns,
            "baseline": BASELINE, "peers": peer_versions(Path(args.peers_venv)),
            "cells": cells}


def peer_versions(venv: Path) -> dict[str, str]:
    pip = venv / "bin" / "pip"
    if not pip.exists():
        return {}
    out = subprocess.run([str(pip), "list", "--format", "json"], capture_output=True, text=True)
    wanted = {"sglang-router", "vllm-router"}
    return {p["name"]: p["version"] for p in json.loads(out.stdout or "[]") if p["name"] in wanted}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="lmroute against sglang-router and vllm-router")
    ap.add_argument("--peers-venv", default=".venv-peers")
    ap.add_argument("--policies", nargs="+", default=["round_robin", "prefix_affinity", "locality"])
    # The peers run at --log-level error (no per-request lines): lmroute's access log is off too.
    ap.add_argument("--lmroute-args", nargs="*", default=["--no-access-log"],
                    help="extra `lmroute serve` options (default: --no-access-log)")
    ap.add_argument("--before", help="a checkout (with its .venv) whose lmroute runs too, as "
                    "'lmroute@before POLICY': before/after in the same run")
    ap.add_argument("--before-policies", nargs="+", default=["round_robin"])
    ap.add_argument("--compiled", metavar="VENV",
                    help="a venv whose lmroute has its policies compiled by mypyc (make fast: "
                         ".venv-fast); its policies run too, as 'lmroute POLICY (mypyc)'")
    ap.add_argument("--compiled-policies", nargs="+", default=["locality"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workers-policies", nargs="*", default=[],
                    help="also run these policies with --workers N ('lmroute P xN workers'; "
                         "with --compiled, also that build's: 'lmroute P xN workers (mypyc)')")
    ap.add_argument("--server", action="append", default=[], choices=SERVERS,
                    help="also serve the app with this ASGI server instead of uvicorn "
                         "('lmroute P on SERVER', router.asgi; make bench-servers)")
    ap.add_argument("--server-policies", nargs="+", default=["round_robin"])
    ap.add_argument("--floor", action="store_true",
                    help="also run bench/raw_relay.py: a uvloop byte relay, no HTTP (the floor "
                         "of any Python router)")
    ap.add_argument("--floor-workers", action="store_true",
                    help="also run that relay in --workers processes serving one socket "
                         "('python floor xN workers'): what N processes on one core cost "
                         "with no router in them")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=ARGS: also `lmroute serve ARGS` as target NAME (repeat)")
    ap.add_argument("--only", nargs="+", choices=("nonstream", "stream", "paced", "c1"),
                    help="run only these measurements (e.g. paced, with --events 4 and 32: "
                         "CPU per event against CPU per request)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=int, default=8, help="seconds per loaded wrk run")
    ap.add_argument("--low-duration", type=int, default=5, help="seconds per c1 run")
    ap.add_argument("--events", type=int, default=16, help="tokens per paced stream")
    ap.add_argument("--delay-ms", type=float, default=10.0, help="between paced events")
    ap.add_argument("--paced-conns", type=int, default=64)
    ap.add_argument("--json", type=Path, default=Path("out/bench-peers.json"))
    ap.add_argument("--plot", type=Path, default=Path("out/bench-peers.png"))
    args = ap.parse_args(argv)
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            print(f"{tool} not found on PATH (apt-get install wrk util-linux)", file=sys.stderr)
            return 2
    if not (Path(args.peers_venv) / "bin" / "sglang-router").exists():
        print(f"no sglang-router in {args.peers_venv}: the baseline is missing", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    doc = run(args)
    doc["ratios"] = ratios(doc)
    doc["table"] = table(doc)
    print("\n" + doc["table"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1))
    plot(doc, args.plot)
    print(f"wrote {args.json} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
