"""Unsettled dispatches as a residency overlay: the structure, and a live router using it."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import httpx
from servers import replica, router
from test_prefix_routing import DOCS, turn

from policies.base import Residency
from router.in_flight import InFlightPrefixes
from router.index.memory import MemoryIndex
from router.locator import Locator
from router.metrics import RouterMetrics
from router.prefix import root_key, token_chain
from router.replicas import ReplicaSet
from router.upstream import Upstream


def _chain(tokens: list[int]) -> list[int]:
    return token_chain(tokens, root_key("m", None, None), 16)


def test_longest_is_the_shared_prefix_of_any_unsettled_dispatch() -> None:
    rng = random.Random(7)
    doc = [rng.randrange(50_000) for _ in range(16 * 40)]
    a = _chain(doc + [1] * 16 * 5)  # 45 blocks, 40 shared with b
    b = _chain(doc + [2] * 16 * 3)
    other = _chain([rng.randrange(50_000) for _ in range(16 * 10)])
    flight = InFlightPrefixes()
    flight.add("x", "r0", a)
    for n in (1, 2, 39, 40, 41, 44, 45):
        assert flight.longest(b[:n], "r0") == min(n, 40)
        assert flight.longest(a[:n], "r0") == n
    assert flight.longest(b, "r1") == 0 and flight.longest(other, "r0") == 0
    # Two requests hold the shared blocks: settling one keeps the other's.
    flight.add("y", "r0", b)
    flight.settle("x")
    assert flight.longest(a, "r0") == 40 and flight.longest(b, "r0") == 43
    flight.settle("y")
    flight.settle("y")  # twice: nothing left to settle, no error
    assert flight.longest(b, "r0") == 0 and len(flight) == 0


def test_readers_are_the_unsettled_requests_holding_the_longest_cached_prefix() -> None:
    rng = random.Random(11)
    doc = [rng.randrange(50_000) for _ in range(16 * 40)]
    question = [_chain(doc + [q] * 16 * 2) for q in range(4)]  # 42 blocks, 40 shared
    flight = InFlightPrefixes()
    flight.add("q0", "r0", question[0])
    flight.add("q1", "r0", question[1])
    flight.add("q2", "r1", question[2])
    # A document still being computed for the first time has no readers (it is better
    # waited for than computed again); once the index holds it, they are its readers.
    seen = flight.overlay(Residency(), question[3])
    assert seen.gpu == {"r0": 40, "r1": 40} and seen.readers == 0
    indexed = Residency(chain_blocks=42, gpu={"r0": 40})
    assert flight.overlay(indexed, question[3]).readers == 3
    assert flight.overlay(Residency(chain_blocks=42, pool=40), question[3]).readers == 3
    # The index holds more of this request's chain (its own earlier turn, settled):
    # nobody in flight reads that deeper prefix.
    assert flight.overlay(Residency(chain_blocks=42, gpu={"r2": 42}), question[3]).readers == 0
    flight.settle("q0")
    flight.settle("q2")
    assert flight.overlay(indexed, question[3]).readers == 1
    private = _chain([rng.randrange(50_000) for _ in range(16 * 10)])
    assert flight.overlay(Residency(chain_blocks=10, gpu={"r0": 10}), private).readers == 0


def test_a_retry_moves_the_request_and_an_ejected_replica_holds_nothing() -> None:
    chain = _chain(list(range(16 * 8)))
    flight = InFlightPrefixes()
    flight.add("x", "r0", chain)
    flight.add("x", "r1", chain)  # the retry: the first attempt was settled by it
    assert flight.longest(chain, "r0") == 0 and flight.longest(chain, "r1") == 8
    flight.add("y", "r2", chain)
    flight.forget("r2")
    assert flight.longest(chain, "r2") == 0
    flight.settle("y")  # settled after the replica was forgotten: nothing to undo
    assert flight.longest(chain, "r1") == 8


def test_overlay_raises_gpu_counts_and_never_lowers_them() -> None:
    chain = _chain(list(range(16 * 10)))
    flight = InFlightPrefixes()
    found = Residency(10, 16, {"r0": 10, "r1": 2}, pool=4)
    assert flight.overlay(found, chain) is found  # nothing in flight: unchanged
    flight.add("x", "r0", chain[:6])
    flight.add("y", "r1", chain[:6])
    flight.add("z", "r2", chain[:3])
    out = flight.overlay(found, chain)
    assert out.gpu == {"r0": 10, "r1": 6, "r2": 3} and out.pool == 4
    assert out.chain_blocks == 10 and out.block_tokens == 16
    assert found.gpu == {"r0": 10, "r1": 2}  # the index's answer is not modified


def _replicas(url: str) -> list[dict[str, int]]:
    replicas: list[dict[str, int]] = httpx.get(url + "/replicas").json()["replicas"]
    return replicas


def test_a_request_sharing_a_prefix_in_flight_follows_it(start_servers) -> None:
    """The index learns a prefix only when its reply ends; a second session on the same
    document arriving meanwhile must still find it where it is being computed, not be
    placed by load (which, one request being in flight there, is the other replica)."""
    reps = [start_servers(replica("--ttft", "1.5")), start_servers(replica("--ttft", "1.5"))]
    lm = start_servers(router([r.url for r in reps], "--policy", "prefix_affinity"))
    first: dict[str, httpx.Response] = {}

    def send() -> None:
        first["r"] = httpx.post(lm.url + "/v1/chat/completions", json=turn(DOCS[2], 0),
                                headers={"x-session-id": "a"}, timeout=30)

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.monotonic() + 10
    while sum(r["in_flight"] for r in _replicas(lm.url)) < 1:
        assert time.monotonic() < deadline, "the first request never went out"
        time.sleep(0.02)
    second = httpx.post(lm.url + "/v1/chat/completions", json=turn(DOCS[2], 1),
                        headers={"x-session-id": "b"}, timeout=30)
    thread.join()
    assert first["r"].headers["x-lmroute-reason"] == "miss"
    assert second.headers["x-lmroute-reason"] == "gpu-hit"
    assert second.headers["x-lmroute-replica"] == first["r"].headers["x-lmroute-replica"]


def test_a_precise_replica_s_entry_goes_at_the_first_token() -> None:
    """Where KV events flow they take over once the prompt is computed (the entry of a
    long stream would otherwise hold thousands of keys through its whole decode); an
    approximate replica's stays until the reply is recorded."""
    reps = ReplicaSet(["http://p", "http://q"], Upstream(connect_timeout_s=1.0,
                      first_byte_timeout_s=1.0), health_interval_s=1.0, health_timeout_s=1.0,
                      eject_after=3, readmit_after=1, scrape_interval_s=1.0,
                      clock=time.monotonic)
    locator = Locator(MemoryIndex(), RouterMetrics(reps), block_bytes=1024,
                      pool_write_through=False, precise=lambda replica: replica == "p")
    chain = _chain(list(range(16 * 4)))
    locator.dispatched("a", chain, "p")
    locator.dispatched("b", chain, "q")
    assert asyncio.run(locator.residency(chain)).gpu == {"p": 4, "q": 4}
    locator.first_token("a", "p")
    locator.first_token("b", "q")
    assert asyncio.run(locator.residency(chain)).gpu == {"q": 4}
    locator.settled("b")
    assert asyncio.run(locator.residency(chain)).gpu == {}
