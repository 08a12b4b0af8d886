"""The live canary against real processes: two emulated replicas on one Redis pool, a
real ``lmroute serve`` at the default canary rate, steady multi-turn load.

Healthy, canaries run and come out clean; when the pool turns corrupt mid-run, the pool
is marked suspect (gauge, admin state), no ``pool-hit`` decision follows, and no client
request fails; the admin call clears it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

try:
    from servers import pooled_deployment
except ImportError:  # tests/ became a package
    from tests.servers import pooled_deployment

KEY = "canary-admin"
ADMIN = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def deployment() -> Iterator[dict[str, Any]]:
    # The default rate (every 100th reply); a budget the test's burst of load can use.
    with pooled_deployment("--admin-key", KEY, "--canary-budget", "600",
                           "--canary-clean-to-clear", "3") as (rt, reps):
        yield {"router": rt.url, "replicas": [r.url for r in reps]}


async def _load(url: str, stop: asyncio.Event, statuses: list[int], sessions: int = 6) -> None:
    """Multi-turn sessions: each turn's prompt extends the last (its prefix is pooled)."""

    async def session(client: httpx.AsyncClient, s: int) -> None:
        text = f"session {s} shares a long document about caches. " * 200
        turn = 0
        while not stop.is_set():
            turn += 1
            text += f" turn {turn} adds a question about pools and prefixes." * 20
            resp = await client.post(url + "/v1/chat/completions", headers={
                "x-session-id": f"s{s}"}, json={"messages": [{"role": "user", "content": text}],
                                                "max_tokens": 4})
            statuses.append(resp.status_code)
            if turn >= 12:  # a fresh session: prompts stay a few thousand tokens
                text, turn = f"session {s} starts again {time.monotonic()}. " * 200, 0

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(session(client, s) for s in range(sessions)))


async def _canary(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        resp = await client.get(url + "/admin/canary", headers=ADMIN)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data


async def _pool_hits_and_gauge(url: str) -> tuple[float, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "/metrics")).text
    hits = gauge = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "lmroute_decisions_total" and sample.labels["reason"] == "pool-hit":
                hits += sample.value
            if sample.name == "lmroute_pool_suspect":
                gauge = sample.value
    return hits, gauge


async def _until(check: Any, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not await check():
        assert time.monotonic() - t0 < timeout_s, "not within the bound"
        await asyncio.sleep(0.2)
    return time.monotonic() - t0


async def test_a_pool_turning_corrupt_is_suspected_and_routed_around(
        deployment: dict[str, Any]) -> None:
    url, reps = deployment["router"], deployment["replicas"]
    stop, statuses = asyncio.Event(), []
    load = asyncio.create_task(_load(url, stop, statuses))
    try:
        async def clean_seen() -> bool:
            return (await _canary(url))["results"].get("clean", 0) >= 2
        await _until(clean_seen, 90)
        assert not (await _canary(url))["suspect"]  # healthy: canaries ran, all clean
        async with httpx.AsyncClient() as client:
            for r in reps:
                await client.post(r + "/_emulator/faults", json={"corrupt_pool": "all"})

        async def suspect() -> bool:
            return bool((await _canary(url))["suspect"])
        await _until(suspect, 60)
        state = await _canary(url)
        assert "diverged from a cold replay" in state["why"]
        hits, gauge = await _pool_hits_and_gauge(url)
        assert gauge == 1.0
        await asyncio.sleep(2.0)  # steady load goes on: no session moves onto a pool hit
        assert (await _pool_hits_and_gauge(url))[0] == hits
    finally:
        stop.set()
        await load
    assert statuses and set(statuses) == {200}
    async with httpx.AsyncClient() as client:
        cleared = (await client.post(url + "/admin/canary/clear", headers=ADMIN)).json()
    assert cleared["suspect"] is False
    assert (await _pool_hits_and_gauge(url))[1] == 0.0
