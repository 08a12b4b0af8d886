"""How often the router's cyclic garbage collector runs under load, and how long it stops it.

The router freezes start-up's objects and collects young objects only every 50,000 net
allocations (``router.hotpath.freeze_gc``). Objects freed by reference counting never count
towards that; objects left in reference cycles do, and each collection then walks every
young object with the event loop stopped: every stream in flight waits. This benchmark runs
``lmroute serve`` under a recorder (``gc.callbacks``: each collection's generation,
duration and objects collected) in front of two paced fake engines (``fake_backend.py``:
``--events`` SSE events ``--delay-ms`` apart, as an engine decodes), drives it with
``wrk -t2 -c<--conns>`` for ``--duration`` seconds of streamed chat requests, and reports
the collections during the load: how many, their pauses, and the objects they freed per
request (what a request leaves in cycles).

Layout as ``peers.py``: router on core 0, backends and wrk on core 1 (``taskset``).

    .venv/bin/python bench/gc_pauses.py [--policy locality] [--duration 10]
        [--lmroute-path /path/to/another/checkout] [--json out/gc-pauses.json]

``--lmroute-path``: import the router from that checkout instead (before/after).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peers import LOAD_CPU, ROUTER_CPU  # noqa: E402
from upstream_clients import BODY, HOST, LUA_TEMPLATE, free_port, run_wrk, started  # noqa: E402


def record(out: Path) -> None:
    """In the router's process: append every collection to ``out``'s JSON, once a second."""
    log: list[dict[str, float]] = []
    began = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            log.append({"at": time.time(), "generation": info["generation"],
                        "pause_s": time.perf_counter() - began[0],
                        "collected": info["collected"]})

    def flush() -> None:
        while True:
            time.sleep(1.0)
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(list(log)))
            tmp.replace(out)

    gc.callbacks.append(callback)
    threading.Thread(target=flush, daemon=True).start()


def launch(out: Path, serve_args: list[str]) -> None:
    record(out)
    from router.cli import main as lmroute

    sys.exit(lmroute(["serve", *serve_args]))


def measure(args: argparse.Namespace) -> dict[str, Any]:
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="gc_pauses_") as tmp, ExitStack() as stack:
        lua = Path(tmp) / "stream.lua"
        lua.write_text(LUA_TEMPLATE % (BODY % ',"stream":true'))
        backends = [free_port(), free_port()]
        for port in backends:
            stack.enter_context(started(
                ["taskset", "-c", LOAD_CPU, py, str(HERE / "fake_backend.py"), "--host", HOST,
                 "--port", str(port), "--tokens", str(args.events),
                 "--token-delay", str(args.delay_ms / 1000)], port, f"backend {port}"))
        port, log = free_port(), Path(tmp) / "gc.json"
        path = [f"PYTHONPATH={args.lmroute_path}"] if args.lmroute_path else []
        cmd = ["taskset", "-c", ROUTER_CPU, "env", *path, py, str(Path(__file__).resolve()),
               "--launch", str(log),
               "--", *[a for b in backends for a in ("--backend", f"http://{HOST}:{b}")],
               "--policy", args.policy, "--host", HOST, "--port", str(port),
               "--drain-grace-s", "0", "--no-access-log"]
        with started(cmd, port, "lmroute"):
            run_wrk(port, lua, cpu=LOAD_CPU, threads=2, conns=args.conns, duration_s=2)  # warm
            time.sleep(1.5)
            t0 = time.time()
            stats, wrk = run_wrk(port, lua, cpu=LOAD_CPU, threads=2, conns=args.conns,
                                 duration_s=args.duration)
            t1 = time.time()
            time.sleep(1.5)
            during = [c for c in json.loads(log.read_text()) if t0 <= c["at"] <= t1]
    pauses = sorted(c["pause_s"] * 1000 for c in during)
    requests = stats["requests"]
    return {
        "policy": args.policy, "lmroute_path": args.lmroute_path or str(HERE.parent),
        "requests": requests, "rps": stats["rps"], "wrk": wrk,
        "events_per_stream": args.events + 1, "delay_ms": args.delay_ms, "conns": args.conns,
        "collections": len(during),
        "collections_per_1000_requests": round(1000 * len(during) / max(requests, 1), 2),
        "pause_ms_max": round(pauses[-1], 2) if pauses else 0.0,
        "pause_ms_total": round(sum(pauses), 2),
        "gc_us_per_request": round(1000 * sum(pauses) / max(requests, 1), 2),
        "collected_per_request": round(sum(c["collected"] for c in during) / max(requests, 1), 2),
        "by_generation": {g: sum(c["generation"] == g for c in during) for g in (0, 1, 2)},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--launch"]:  # inside the router's process
        launch(Path(argv[1]), argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="locality")
    ap.add_argument("--duration", type=int, default=10, help="seconds of measured load")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--events", type=int, default=16, help="tokens per paced stream")
    ap.add_argument("--delay-ms", type=float, default=10.0, help="between paced events")
    ap.add_argument("--lmroute-path", default="", help="import the router from this checkout")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = measure(args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
