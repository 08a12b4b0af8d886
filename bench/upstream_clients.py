"""Benchmark: which upstream HTTP client should the proxy use to talk to replicas?

Compares three otherwise identical FastAPI proxies (``bench/naive_proxies.py``): httpx with its
default transport, httpx with the ``httpx-aiohttp`` transport, and aiohttp's ClientSession,
plus wrk straight at the backend ("direct") as the ceiling.

Layout on a 2-core machine: the fake backend (``bench/fake_backend.py``) is pinned to core 1,
the proxy under test to core 0, and wrk to core 1 (so the proxy has a core to itself; the
backend is an order of magnitude faster than any proxy here, so sharing its core with wrk does
not limit the proxy). For the direct run wrk is pinned to core 0 instead.

For each target and each round it runs, with a POST body written to a temporary Lua script:

* loaded: ``wrk -t2 -c64 -d10s --latency`` for a non-streamed and a streamed request;
* low load: ``wrk -t1 -c1 -d5s --latency`` for the same two requests.

It installs nothing; it needs ``wrk`` on PATH. Everything it starts is stopped by pid.
Only 127.0.0.1 is used; ports are picked free at start.

Usage::

    .venv/bin/python bench/upstream_clients.py [--rounds 2] [--json out/upstream_clients.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
PATH = "/v1/chat/completions"
CLIENTS = ("httpx", "httpx-aiohttp", "aiohttp")
TARGETS = ("direct", *CLIENTS)
BACKEND_CPU = "1"
PROXY_CPU = "0"
READY_TIMEOUT_S = 30.0

BODY = '{"model":"fake-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16%s}'
LUA_TEMPLATE = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '%s'
"""


@dataclass
class WrkResult:
    """The parts of one wrk run this benchmark reports."""

    target: str
    mode: str  # "stream" or "non-stream"
    load: str  # "c64" or "c1"
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int  # socket errors plus non-2xx/3xx replies
    loadavg_before: float
    command: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def http_get_ok(port: int, path: str, timeout: float = 1.0) -> bool:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def http_post(port: int, body: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=10.0)
    try:
        conn.request("POST", PATH, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("content-type", ""), resp.read()
    finally:
        conn.close()


def wait_ready(proc: subprocess.Popen[bytes], port: int, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before becoming ready")
        if http_get_ok(port, "/health"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready on port {port} after {READY_TIMEOUT_S:.0f}s")


def check_replies(port: int, what: str) -> None:
    """One non-streamed and one streamed request must come back complete."""
    status, ctype, data = http_post(port, BODY % "")
    if status != 200 or json.loads(data)["usage"]["completion_tokens"] != 16:
        raise RuntimeError(f"{what}: bad non-stream reply {status} {data[:200]!r}")
    status, ctype, data = http_post(port, BODY % ',"stream":true')
    events = [ln for ln in data.split(b"\n") if ln.startswith(b"data: ")]
    if status != 200 or "text/event-stream" not in ctype or len(events) != 17:
        raise RuntimeError(f"{what}: bad stream reply {status} {ctype} {len(events)} events")


def rss_kib(pid: int) -> int:
    """A process's resident memory (``VmRSS`` in ``/proc/PID/status``), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop one process we started, by its pid: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextmanager
def started(cmd: list[str], port: int, what: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        wait_ready(proc, port, what)
        yield proc
    finally:
        stop(proc)


def _ms(value: str, unit: str) -> float:
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]
    return float(value) * scale


def parse_wrk(out: str) -> dict[str, float]:
    """Requests/s, p50, p99, request count and error count from wrk --latency output."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    if not rps or not total:
        raise RuntimeError(f"cannot parse wrk output:\n{out}")
    pct: dict[str, float] = {}
    for p, val, unit in re.findall(r"^\s+(50|99)(?:\.000)?%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M):
        pct[p] = _ms(val, unit)
    errors = 0
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        errors += sum(int(x) for x in sock.groups())
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        errors += int(non2xx.group(1))
    return {
        "rps": float(rps.group(1)),
        "p50_ms": pct.get("50", float("nan")),
        "p99_ms": pct.get("99", float("nan")),
        "requests": float(total.group(1)),
        "errors": float(errors),
    }


def run_wrk(
    port: int, lua: Path, *, cpu: str, threads: int, conns: int, duration_s: int
) -> tuple[dict[str, float], list[str]]:
    cmd = [
        "taskset", "-c", cpu, "wrk", f"-t{threads}", f"-c{conns}", f"-d{duration_s}s",
        "--latency", "--timeout", "10s", "-s", str(lua), f"http://{HOST}:{port}{PATH}",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 30, check=True)
    return parse_wrk(out.stdout), cmd


def measure_target(
    target: str, port: int, luas: dict[str, Path], rnd: int, args: argparse.Namespace
) -> list[WrkResult]:
    wrk_cpu = PROXY_CPU if target == "direct" else BACKEND_CPU
    results: list[WrkResult] = []
    # Short warm-up so connection pools and code paths are hot.
    run_wrk(port, luas["non-stream"], cpu=wrk_cpu, threads=2, conns=64, duration_s=1)
    plan = [("c64", 2, 64, args.duration), ("c1", 1, 1, args.low_duration)]
    for load, threads, conns, dur in plan:
        for mode in ("non-stream", "stream"):
            before = os.getloadavg()[0]
            stats, cmd = run_wrk(
                port, luas[mode], cpu=wrk_cpu, threads=threads, conns=conns, duration_s=dur
            )
            r = WrkResult(
                target=target, mode=mode, load=load, round=rnd, rps=stats["rps"],
                p50_ms=stats["p50_ms"], p99_ms=stats["p99_ms"], requests=int(stats["requests"]),
                errors=int(stats["errors"]), loadavg_before=before, command=cmd,
            )  # fmt: skip
            print(
                f"  round {rnd} {target:14s} {load:3s} {mode:10s} {r.rps:9.0f} req/s  "
                f"p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  errors {r.errors}  "
                f"(load avg {before:.2f})",
                flush=True,
            )
            results.append(r)
    return results


def markdown(results: list[WrkResult], rounds: int) -> str:
    """One row per target; each cell lists one value per round, separated by "; "."""

    def runs(target: str, mode: str, load: str) -> list[WrkResult]:
        found = [r for r in results if (r.target, r.mode, r.load) == (target, mode, load)]
        return sorted(found, key=lambda r: r.round)

    def rps(target: str, mode: str) -> str:
        return "; ".join(f"{r.rps:,.0f}" for r in runs(target, mode, "c64")) or "-"

    def lat(target: str, mode: str, load: str) -> str:
        cells = [f"{r.p50_ms:.2f}/{r.p99_ms:.2f}" for r in runs(target, mode, load)]
        return "; ".join(cells) or "-"

    lines = [
        "| target | req/s non-stream c64 | req/s stream c64 | p50/p99 ms non-stream c64 "
        "| p50/p99 ms stream c64 | p50/p99 ms non-stream c1 | p50/p99 ms stream c1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in TARGETS:
        if not any(r.target == t for r in results):
            continue
        row = [
            t,
            rps(t, "non-stream"),
            rps(t, "stream"),
            lat(t, "non-stream", "c64"),
            lat(t, "stream", "c64"),
            lat(t, "non-stream", "c1"),
            lat(t, "stream", "c1"),
        ]
        lines.append("| " + " | ".join(row) + " |")
    errs = sum(r.errors for r in results)
    lines += [
        "",
        f"{rounds} round(s); each cell lists one value per round, separated by '; '. "
        f"Errors (socket errors + non-2xx) over all runs: {errs}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compare upstream HTTP clients for the proxy")
    parser.add_argument("--rounds", type=int, default=2, help="full passes over all targets")
    parser.add_argument("--duration", type=int, default=10, help="seconds per loaded wrk run")
    parser.add_argument("--low-duration", type=int, default=5, help="seconds per c1 wrk run")
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--json", type=Path, help="write all results here")
    args = parser.parse_args(argv)

    if shutil.which("wrk") is None:
        print("wrk not found on PATH; install it with: apt-get install wrk", file=sys.stderr)
        return 2
    if shutil.which("taskset") is None:
        print("taskset not found (package util-linux)", file=sys.stderr)
        return 2
    if (os.cpu_count() or 1) < 2:
        print("needs at least 2 CPUs (cores 0 and 1)", file=sys.stderr)
        return 2

    # SIGTERM -> KeyboardInterrupt, so the finally blocks stop our children.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    py = sys.executable
    results: list[WrkResult] = []
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with tempfile.TemporaryDirectory(prefix="upstream_clients_") as tmp:
        luas: dict[str, Path] = {}
        for mode, extra in (("non-stream", ""), ("stream", ',"stream":true')):
            luas[mode] = Path(tmp) / f"{mode}.lua"
            luas[mode].write_text(LUA_TEMPLATE % (BODY % extra))
        backend_port = free_port()
        backend_cmd = [
            "taskset", "-c", BACKEND_CPU, py, str(HERE / "fake_backend.py"),
            "--host", HOST, "--port", str(backend_port),
        ]  # fmt: skip
        with started(backend_cmd, backend_port, "fake backend"):
            check_replies(backend_port, "fake backend")
            for rnd in range(1, args.rounds + 1):
                print(f"round {rnd}/{args.rounds}", flush=True)
                for target in args.targets:
                    if target == "direct":
                        results += measure_target(target, backend_port, luas, rnd, args)
                        continue
                    port = free_port()
                    proxy_cmd = [
                        "taskset", "-c", PROXY_CPU, py, str(HERE / "naive_proxies.py"),
                        "--client", target, "--host", HOST, "--port", str(port),
                        "--backend", f"http://{HOST}:{backend_port}",
                    ]  # fmt: skip
                    with started(proxy_cmd, port, f"proxy ({target})"):
                        check_replies(port, f"proxy ({target})")
                        results += measure_target(target, port, luas, rnd, args)

    table = markdown(results, args.rounds)
    print()
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "started_at": started_at,
            "cpus": os.cpu_count(),
            "pinning": {"backend": BACKEND_CPU, "proxy": PROXY_CPU, "wrk": "1 (direct: 0)"},
            "python": sys.version.split()[0],
            "results": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(doc, indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
