"""bench/decision_latency.py drives the router's own routing step: it must keep running as
the request path changes (it broke once when ``Proxy._view`` changed its signature)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from decision_latency import STEPS, measure


def test_the_decision_benchmark_times_every_step() -> None:
    out = asyncio.run(measure(replicas=4, tokens=4096, queued=2, n=20, clock="cpu"))
    for step in STEPS:
        assert out[step]["p50_us"] > 0 and out[step]["max_us"] >= out[step]["p99_us"]
