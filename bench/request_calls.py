"""Python function calls per request on the router's request path: a count, not a timing.

The request path's cost on one core is mostly Python calls, and a change of a few percent
is under the round-to-round spread of ``bench/peers.py`` on a 2-core host. A call count
is exact and the same on any host. For each policy: two fast fake engines
(``fake_backend.py``) and ``lmroute serve`` under cProfile (``_profiled.py`` starts it
with the profiler on and writes the stats when it exits), ``--warm`` requests and then
``--n`` more, one at a time on one keep-alive connection, then the router is stopped
(SIGINT); the same again with only the warm-up. The difference of the two profiles over
``--n`` is each function's calls per request, start-up and shut-down cancelled out.
Printed per policy: calls per request, and the functions that make the most calls (the
calls each function makes, per request).

    .venv/bin/python bench/request_calls.py [--policies round_robin locality] [--stream]
        [--n 1000] [--warm 200] [--top 25] [--tree CHECKOUT] [--json out.json]

``--tree``: profile another checkout's router (a worktree of an earlier commit: its
``router`` and ``policies`` are imported first), with this venv's packages.

Pure Python only: the compiled policies (``make fast``) run as C, invisible to the
profiler. Not part of CI; about 30 s a policy.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from upstream_clients import HOST, free_port, started, wait_ready  # noqa: E402


def _send(url: str, n: int, stream: bool) -> None:
    body = {"model": "fake-model", "prompt": "hello there, a short prompt", "max_tokens": 4,
            "stream": stream}
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            resp = client.post(url + "/v1/completions", json=body)
            if resp.status_code != 200:
                raise RuntimeError(f"router answered {resp.status_code}: {resp.text[:200]}")


def profile(policy: str, backends: list[str], requests: int, stream: bool,
            out: Path, tree: Path) -> pstats.Stats:
    """The router's stats after ``requests`` requests (it is stopped to write them)."""
    port = free_port()
    cmd = [sys.executable, str(HERE / "_profiled.py"), str(out), "serve", "--policy", policy,
           "--host", HOST, "--port", str(port), "--drain-grace-s", "0",
           "--no-access-log", *[a for b in backends for a in ("--backend", b)]]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_ready(proc, port, f"lmroute {policy}")
        _send(f"http://{HOST}:{port}", requests, stream)
    finally:
        # SIGINT: uvicorn stops and the interpreter exits normally, so the stats are
        # written (after SIGTERM it re-raises the signal and dies before atexit runs).
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    return pstats.Stats(str(out))


def _short(path: str) -> str:
    """A profiled function's file, from its package on (``router/proxy.py``)."""
    for mark in ("site-packages/", "/router/", "/policies/"):
        if mark in path:
            tail = path.rpartition(mark)[2]
            return tail if mark == "site-packages/" else mark.strip("/") + "/" + tail
    return path


def per_request(base: pstats.Stats, more: pstats.Stats, n: int
                ) -> tuple[float, list[tuple[str, float]]]:
    """Calls per request, and per function the calls it makes per request."""
    a: dict[Any, Any] = base.stats  # type: ignore[attr-defined]
    b: dict[Any, Any] = more.stats  # type: ignore[attr-defined]
    total = sum(v[1] - a.get(k, (0, 0))[1] for k, v in b.items())
    made: dict[str, float] = {}
    for callee, v in b.items():
        before = a.get(callee, (0, 0, 0, 0, {}))[4]
        for caller, cv in v[4].items():
            f, line, name = caller
            where = f"{_short(f)}:{line}({name})"
            made[where] = made.get(where, 0) + cv[0] - before.get(caller, (0,))[0]
    top = sorted(((k, c / n) for k, c in made.items()), key=lambda kv: -kv[1])
    return total / n, top


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", nargs="+", default=["round_robin", "locality"])
    ap.add_argument("--stream", action="store_true", help="streamed replies (4 tokens)")
    ap.add_argument("--n", type=int, default=1000, help="requests counted")
    ap.add_argument("--warm", type=int, default=200, help="requests before them")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--tree", type=Path, default=REPO, help="the checkout to profile")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ports = [free_port(), free_port()]
    backends = [f"http://{HOST}:{p}" for p in ports]
    results: dict[str, Any] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        for p in ports:  # two fast fake engines, stopped on the way out
            stack.enter_context(started([sys.executable, str(HERE / "fake_backend.py"),
                                         "--port", str(p)], p, f"backend {p}"))
        for policy in args.policies:
            base = profile(policy, backends, args.warm, args.stream, Path(tmp) / "a", args.tree)
            more = profile(policy, backends, args.warm + args.n, args.stream, Path(tmp) / "b",
                           args.tree)
            calls, top = per_request(base, more, args.n)
            results[policy] = {"calls_per_request": round(calls, 1),
                               "top": [[k, round(c, 2)] for k, c in top[:args.top]]}
            print(f"## {policy}: {calls:.1f} Python calls a "
                  f"{'streamed' if args.stream else 'non-streamed'} request")
            for k, c in top[:args.top]:
                print(f"{c:8.2f}  {k}")
            print()
    if args.json:
        params = {**vars(args), "tree": str(args.tree)}
        Path(args.json).write_text(json.dumps({"params": params, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
