"""bench/raw_relay.py --workers N: the floor that ``bench/peers.py --floor-workers`` sets
beside ``lmroute serve --workers N`` must really be N processes relaying one socket, each
reply whole, and all of them must go when the parent is told to stop (or the benchmark
would compare one process against two, or leave relays running)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

try:
    from servers import Server, free_port, replica
except ImportError:  # tests/ became a package
    from tests.servers import Server, free_port, replica

RELAY = Path(__file__).resolve().parents[2] / "bench" / "raw_relay.py"


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child the parent has not reaped yet is a zombie: gone for our purpose.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_two_workers_relay_every_request_and_stop_with_the_parent(
        start_servers: Callable[[Server], Server]) -> None:
    backend = start_servers(replica("--tpot", "0.001"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(RELAY), "--port", str(port), "--backend",
                             backend.url, "--workers", "2"])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the relay never listened"
                time.sleep(0.1)
        workers = _children(proc.pid)
        assert len(workers) == 2
        body = {"model": "emulated-27b", "prompt": "hello relay", "max_tokens": 4}
        for _ in range(20):  # a new connection each: accepted by either worker
            r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=10)
            assert r.status_code == 200
            assert r.json()["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        deadline = time.monotonic() + 5
        while any(_alive(w) for w in workers):
            assert time.monotonic() < deadline, "a worker outlived its parent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
