"""bench/decision_latency.py drives the router's own routing step: it must keep running as
the request path changes (it broke once when ``Proxy._view`` changed its signature)."""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from policies.locality import Locality
from router.openai_api import parse_request

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from decision_latency import STEPS, _fill, _proxy, _raw_body, measure


def test_the_decision_benchmark_times_every_step() -> None:
    out = asyncio.run(measure(replicas=4, tokens=4096, queued=2, n=20, clock="cpu"))
    for step in STEPS:
        assert out[step]["p50_us"] > 0 and out[step]["max_us"] >= out[step]["p99_us"]


def test_readers_in_flight_are_what_every_decision_sees() -> None:
    """``--readers``: the requests kept in flight on the replica holding most of the prompt
    are its readers to every decision, so the copy's benefit is priced on the others."""
    proxy = _proxy(4, Locality())
    parsed = parse_request("chat", _raw_body(4096, random.Random(0)), "s")
    chain, tokens = proxy.locator.prompt_chain(parsed)
    _fill(proxy, chain, 1, 3)
    view = asyncio.run(proxy._view(parsed, chain, tokens, "x"))
    holder = proxy.replicas.replicas[-1].id
    assert view.residency.readers == 3
    assert view.residency.gpu[holder] == len(chain)
    assert all(view.residency.gpu.get(r.id, 0) < len(chain) for r in proxy.replicas.replicas[:-1])
    out = asyncio.run(measure(replicas=4, tokens=4096, queued=2, n=20, clock="cpu", readers=3))
    assert out["readers"] == 3 and out["route"]["p50_us"] > 0
