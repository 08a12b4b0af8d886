"""The emulator's corrupt-pool modes, logprobs and /reset_prefix_cache, on two model
replicas sharing one in-process pool (served by uvicorn in the test's loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sim.emulator.deployment import LoopServers, PoolRegistry, close_replica, model_replica
from sim.emulator.replies import CORRUPT_SHIFT
from sim.emulator.server import create_replica_app
from sim.replica.profiles import TINY

MODEL = "emulated-27b"


@pytest.fixture
async def pair() -> AsyncIterator[list[str]]:
    pool = PoolRegistry().resolve("shared", TINY)
    start = time.monotonic()
    # Time scale 1: prefills last milliseconds of wall time, so concurrent ones overlap.
    replicas = [model_replica(n, TINY, pool, model=MODEL, time_scale=1.0, start=start)
                for n in "ab"]
    try:
        async with LoopServers([create_replica_app(r) for r in replicas]) as urls:
            yield urls
    finally:
        for r in replicas:
            close_replica(r)


async def _complete(client: httpx.AsyncClient, url: str, n_ids: int, first: int = 100
                    ) -> dict[str, Any]:
    resp = await client.post(url + "/v1/completions", json={
        "model": MODEL, "prompt": list(range(first, first + n_ids)), "max_tokens": 6,
        "logprobs": 2})
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data


def _lp(reply: dict[str, Any]) -> list[float]:
    return [float(x) for x in reply["choices"][0]["logprobs"]["token_logprobs"]]


def _wrong(good: dict[str, Any], got: dict[str, Any]) -> bool:
    return bool(abs(_lp(good)[0] - _lp(got)[0]) > CORRUPT_SHIFT / 2)


async def _faults(client: httpx.AsyncClient, url: str, **faults: Any) -> httpx.Response:
    return await client.post(url + "/_emulator/faults", json=faults)


async def test_logprobs_have_vllms_shapes_and_only_last_bits_move_on_a_hit(
        pair: list[str]) -> None:
    a, b = pair
    async with httpx.AsyncClient() as client:
        cold = await _complete(client, a, 200)
        pooled = await _complete(client, b, 200)
        lp = cold["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
        assert all(len(t) == 2 for t in lp["top_logprobs"])
        assert pooled["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert lp["tokens"] == pooled["choices"][0]["logprobs"]["tokens"]
        assert max(abs(x - y) for x, y in zip(_lp(cold), _lp(pooled), strict=True)) < 0.01
        chat = await client.post(a + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "logprobs": True, "top_logprobs": 2})
        content = chat.json()["choices"][0]["logprobs"]["content"]
        assert len(content) == 3 and len(content[0]["top_logprobs"]) == 2


async def test_load_mode_corrupts_only_concurrent_loads(pair: list[str]) -> None:
    a, b = pair
    async with httpx.AsyncClient() as client:
        assert (await _faults(client, b, corrupt_pool="load", corrupt_load=2)).status_code == 200
        firsts = range(1000, 9000, 1000)
        goods = [await _complete(client, a, 200, first) for first in firsts]
        alone = await _complete(client, b, 200, 1000)
        assert not _wrong(goods[0], alone)  # one request in prefill: below the threshold
        # Seven at once: later ones queue behind earlier prefills (a few ms each).
        together = await asyncio.gather(*(_complete(client, b, 200, f) for f in firsts[1:]))
        assert any(_wrong(g, t) for g, t in zip(goods[1:], together, strict=True))


async def test_position_mode_corrupts_only_loads_past_the_position(pair: list[str]) -> None:
    a, b = pair
    async with httpx.AsyncClient() as client:
        await _faults(client, b, corrupt_pool="position", corrupt_position=300)
        short, long = await _complete(client, a, 200, 5000), await _complete(client, a, 600, 7000)
        assert not _wrong(short, await _complete(client, b, 200, 5000))
        assert _wrong(long, await _complete(client, b, 600, 7000))


async def test_replica_mode_taints_what_that_replica_writes_for_every_reader(
        pair: list[str]) -> None:
    a, b = pair
    async with httpx.AsyncClient() as client:
        await _faults(client, b, corrupt_pool="replica")
        truth = await _complete(client, a, 200, 9000)  # written by the healthy a
        written_by_b = await _complete(client, b, 200, 11000)
        assert not _wrong(truth, await _complete(client, b, 200, 9000))
        assert _wrong(written_by_b, await _complete(client, a, 200, 11000))  # a reads b's


async def test_reset_prefix_cache_empties_the_gpu_not_the_pool(pair: list[str]) -> None:
    a, _ = pair
    async with httpx.AsyncClient() as client:
        await _complete(client, a, 200, 13000)
        assert (await client.post(a + "/reset_prefix_cache")).status_code == 200
        again = await _complete(client, a, 200, 13000)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        metrics = (await client.get(a + "/metrics")).text
        pooled = [line for line in metrics.splitlines()
                  if line.startswith("vllm:external_prefix_cache_hits_total")]
        assert float(pooled[0].rsplit(" ", 1)[1]) > 0  # the hit came from the pool
        bad = await _faults(client, a, corrupt_pool="sometimes")
        assert bad.status_code == 400 and "corrupt_pool" in bad.json()["error"]["message"]
