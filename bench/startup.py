"""How long ``lmroute serve`` takes to answer, and how much memory the process holds then.

For each target (this checkout, and any ``--before DIR``: another checkout, e.g. a git
worktree, run with this venv's Python from that directory), ``--runs`` times in turn:
start ``lmroute serve`` in front of one backend URL (nothing need listen there:
``/health`` answers without it), time from the spawn to the first answer of
``GET /health``, read the process's resident memory (``VmRSS`` in ``/proc/PID/status``)
at that moment, stop it. Prints each run and the medians.

    .venv/bin/python bench/startup.py --runs 5 [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from upstream_clients import HOST, free_port, http_get_ok, rss_kib, stop

HERE = Path(__file__).resolve().parent


def one_start(cwd: Path, timeout_s: float = 60.0) -> tuple[float, float]:
    """(seconds from spawn to the first answer of /health, RSS in MB then) of the
    checkout at ``cwd`` (``python -m`` puts it first on the path)."""
    port = free_port()
    cmd = [sys.executable, "-m", "router.cli", "serve", "--host", HOST, "--port", str(port),
           "--no-access-log", "--backend", f"http://{HOST}:{free_port()}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        # ``upstream_clients.wait_ready`` polls every 0.1 s: too coarse to time this.
        while not http_get_ok(port, "/health"):
            if proc.poll() is not None or time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"{' '.join(cmd)} did not start")
            time.sleep(0.01)
        return time.perf_counter() - t0, rss_kib(proc.pid) / 1024
    finally:
        stop(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--before", action="append", default=[], type=Path,
                    help="another checkout's directory, measured in turn with this one")
    args = ap.parse_args()
    targets = {"this checkout": HERE.parent}
    for before in args.before:
        targets[str(before)] = before
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    for i in range(args.runs):
        for name, cwd in targets.items():  # interleaved: drift hits every target alike
            s, mb = one_start(cwd)
            runs[name].append((s, mb))
            print(f"run {i}: {name}: {s:.2f} s to /health, {mb:.0f} MB resident", flush=True)
    for name, rows in runs.items():
        print(f"{name}: median {statistics.median(s for s, _ in rows):.2f} s, "
              f"{statistics.median(mb for _, mb in rows):.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
