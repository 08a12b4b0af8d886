"""The shared-pool checks, measured: ``lmroute validate`` per corrupt-pool mode, and the
live canary's time to suspect a pool that turns corrupt under steady load.

Starts a private redis-server, two emulated replicas (``lmroute replica --profile
study-27b --time-scale 0.01 --pool redis://...``) and one router (``lmroute serve
--admin-key``), all subprocesses on 127.0.0.1 (tests/servers.py ``pooled_deployment``),
then:

- ``validate``: for each mode (healthy, all, load, position, replica on r1 only), set
  through ``POST /_emulator/faults``, runs ``lmroute validate`` at its default settings
  and records wall time, exit code and per-tier verdict / first differing position;
- ``canary``: steady multi-turn chat load (``--sessions`` loops) through the router at
  the default canary rate; after ``--healthy-s`` the pool turns corrupt (mode ``all`` on
  both replicas); records the time to ``suspect``, canary results, client statuses and
  client latency percentiles before and after.

Usage::

    .venv/bin/python bench/pool_checks.py [validate|canary|both] [--json out/pool-checks.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from servers import pooled_deployment  # noqa: E402

KEY = "bench-admin"
ADMIN = {"Authorization": f"Bearer {KEY}"}
MODES: list[tuple[str, dict[str, Any], bool]] = [
    ("healthy", {}, False), ("all", {"corrupt_pool": "all"}, False),
    ("load", {"corrupt_pool": "load"}, False), ("position", {"corrupt_pool": "position"}, False),
    ("replica", {"corrupt_pool": "replica"}, True)]


def _faults(urls: list[str], faults: dict[str, Any]) -> None:
    for url in urls:
        httpx.post(url + "/_emulator/faults", json=faults).raise_for_status()


def validate_modes(router_url: str, reps: list[str], out_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for name, faults, one in MODES:
        _faults(reps, {})
        _faults(reps[1:] if one else reps, faults)
        report = out_dir / f"validate-{name}.json"
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "router.cli", "validate", "--target",
                               router_url, "--admin-key", KEY, "--json", str(report)],
                              capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        data = json.loads(report.read_text())
        rows.append({"mode": name, "wall_s": round(wall, 1), "exit_code": done.returncode,
                     "tiers": {t: [v["verdict"], v["matched"], v["prompts"], v["first_diff"],
                                   v["failing_lengths"]] for t, v in data["tiers"].items()}})
        print(json.dumps(rows[-1]))
    _faults(reps, {})
    return rows


async def _session(client: httpx.AsyncClient, url: str, s: int, stop: asyncio.Event,
                   log: list[tuple[float, int, float]]) -> None:
    text, turn = f"session {s} shares a long document about caches. " * 200, 0
    while not stop.is_set():
        turn += 1
        text += f" turn {turn} adds a question about pools and prefixes." * 20
        t0 = time.monotonic()
        resp = await client.post(url + "/v1/chat/completions", headers={"x-session-id": f"s{s}"},
                                 json={"messages": [{"role": "user", "content": text}],
                                       "max_tokens": 4})
        log.append((t0, resp.status_code, time.monotonic() - t0))
        if turn >= 12:
            text, turn = f"session {s} starts again {t0}. " * 200, 0


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1) if xs else 0.0


async def canary(router_url: str, reps: list[str], sessions: int, healthy_s: float,
                 limit_s: float) -> dict[str, Any]:
    stop, log = asyncio.Event(), []
    async with httpx.AsyncClient(timeout=60) as client:
        tasks = [asyncio.create_task(_session(client, router_url, s, stop, log))
                 for s in range(sessions)]
        await asyncio.sleep(healthy_s)
        healthy = (await client.get(router_url + "/admin/canary", headers=ADMIN)).json()
        corrupt_at = time.monotonic()
        _faults(reps, {"corrupt_pool": "all"})
        suspect_after = None
        while time.monotonic() - corrupt_at < limit_s:
            state = (await client.get(router_url + "/admin/canary", headers=ADMIN)).json()
            if state["suspect"]:
                suspect_after = time.monotonic() - corrupt_at
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*tasks)
        final = (await client.get(router_url + "/admin/canary", headers=ADMIN)).json()
    before = [d for t, _, d in log if t < corrupt_at]
    after = [d for t, _, d in log if t >= corrupt_at]
    return {"sessions": sessions, "healthy_s": healthy_s, "requests": len(log),
            "req_per_s": round(len(log) / (healthy_s + (suspect_after or limit_s) + 3), 1),
            "statuses": sorted({s for _, s, _ in log}), "healthy_state": healthy,
            "suspect_after_s": None if suspect_after is None else round(suspect_after, 2),
            "final_state": final, "latency_ms_before": [_pct(before, 0.5), _pct(before, 0.99)],
            "latency_ms_after": [_pct(after, 0.5), _pct(after, 0.99)]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="both", choices=["validate", "canary", "both"])
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--healthy-s", type=float, default=60.0)
    ap.add_argument("--limit-s", type=float, default=120.0)
    ap.add_argument("--canary-budget", default="12")
    ap.add_argument("--time-scale", default="0.01",
                    help="the replicas' --time-scale, wall seconds per model second (1: model time is "
                         "wall time, so the canary's time to suspect reads in model seconds)")
    ap.add_argument("--json")
    args = ap.parse_args()
    out: dict[str, Any] = {}
    with pooled_deployment("--admin-key", KEY, "--canary-budget", args.canary_budget,
                           time_scale=args.time_scale) as (rt, reps):
        urls = [r.url for r in reps]
        if args.what in ("validate", "both"):
            out["validate"] = validate_modes(rt.url, urls, Path("out"))
        if args.what in ("canary", "both"):
            out["canary"] = asyncio.run(canary(rt.url, urls, args.sessions, args.healthy_s,
                                               args.limit_s))
            print(json.dumps(out["canary"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
