"""How a policy splits one repeated request over two identical fast engines.

Two ``bench/fake_backend.py`` engines and ``wrk`` on core 1, ``lmroute serve --policy``
on core 0 (``peers.py``'s layout); ``wrk -t2 -c64`` sends one chat body (so one session
key) for ``--duration`` seconds, ``--runs`` times, each against a freshly started
router. Per run: req/s, each replica's share of the 200s (``lmroute_requests_total``),
and, for ``locality``, what ``GET /policy`` says at the end (per-replica deviations, the
model's running error). The engines are ~170x faster than the prior believes and far
faster than the router, so a replica's FIFO runs measure only how often the router sends
to it (``docs/locality.md``, "Ties as wide as the model's error").

    .venv/bin/python bench/fake_split.py --policy locality --runs 4 [--json out/split.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from peers import LOAD_CPU, ROUTER_CPU
from upstream_clients import BODY, HOST, LUA_TEMPLATE, free_port, run_wrk, started

HERE = Path(__file__).resolve().parent
SERVED = re.compile(r'^lmroute_requests_total\{[^}]*replica="([^"]+)",status="200"\} (\S+)$', re.M)


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=10) as resp:
        return resp.read().decode()


def one_run(policy: str, duration_s: int, lua: Path) -> dict[str, Any]:
    with ExitStack() as stack:
        backends = [free_port(), free_port()]
        for port in backends:
            stack.enter_context(started(
                ["taskset", "-c", LOAD_CPU, sys.executable, str(HERE / "fake_backend.py"),
                 "--host", HOST, "--port", str(port), "--tokens", "16"], port, "backend"))
        port = free_port()
        stack.enter_context(started(
            ["taskset", "-c", ROUTER_CPU, sys.executable, "-m", "router.cli", "serve",
             *[a for b in backends for a in ("--backend", f"http://{HOST}:{b}")],
             "--policy", policy, "--host", HOST, "--port", str(port), "--drain-grace-s", "0",
             "--no-access-log"], port, "lmroute"))
        stats, _ = run_wrk(port, lua, cpu=LOAD_CPU, threads=2, conns=64, duration_s=duration_s)
        served = {url: float(n) for url, n in SERVED.findall(_get(port, "/metrics"))}
        state = json.loads(_get(port, "/policy"))
    total = sum(served.values()) or 1.0
    shares = [served.get(f"http://{HOST}:{b}", 0.0) / total for b in backends]
    out: dict[str, Any] = {"rps": stats["rps"], "shares": shares}
    calibration = state.get("calibration")
    if calibration:
        out["deviations"] = [calibration["replicas"].get(f"http://{HOST}:{b}", {})
                             .get("prefill_deviation") for b in backends]
        out["model_error"] = calibration["prediction_error"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="locality")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--duration", type=int, default=10, help="seconds of wrk per run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        lua = Path(tmp) / "req.lua"
        lua.write_text(LUA_TEMPLATE % (BODY % ""))
        for k in range(args.runs):
            run = one_run(args.policy, args.duration, lua)
            runs.append(run)
            print(f"run {k}: {run['rps']:,.0f} req/s, shares "
                  + "/".join(f"{100 * s:.0f}" for s in run["shares"])
                  + (f", deviations {run['deviations']}, model error {run['model_error']:.2f}"
                     if "deviations" in run else ""), flush=True)
    result = {"policy": args.policy, "duration_s": args.duration, "runs": runs}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
