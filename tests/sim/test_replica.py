"""Model-backed emulated replicas sharing a pool, served by uvicorn in the test's loop."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.emulator.deployment import LoopServers, PoolRegistry, close_replica, model_replica
from sim.emulator.server import create_replica_app
from sim.replica.profiles import TINY

MODEL = "emulated-27b"
VLLM_NAMES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits", "vllm:prompt_tokens", "vllm:prompt_tokens_cached",
    "vllm:generation_tokens", "vllm:num_preemptions", "vllm:time_to_first_token_seconds",
    "vllm:request_queue_time_seconds", "vllm:cache_config_info",
}


@pytest.fixture
async def pair() -> AsyncIterator[list[str]]:
    pool = PoolRegistry().resolve("shared", TINY)
    start = time.monotonic()  # one model clock: the pool's ready times compare
    replicas = [model_replica(n, TINY, pool, model=MODEL, time_scale=0.01, start=start)
                for n in "ab"]
    try:
        async with LoopServers([create_replica_app(r) for r in replicas]) as urls:
            yield urls
    finally:
        for r in replicas:
            close_replica(r)


async def _chat(client: httpx.AsyncClient, url: str, text: str) -> dict[str, object]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 6}
    resp = await client.post(url + "/v1/chat/completions", json=body)
    resp.raise_for_status()
    data: dict[str, object] = resp.json()
    return data


def _cached(reply: dict[str, object]) -> int:
    usage = reply["usage"]
    assert isinstance(usage, dict)
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def _content(reply: dict[str, object]) -> str:
    choices = reply["choices"]
    assert isinstance(choices, list)
    return str(choices[0]["message"]["content"])


async def test_second_replica_loads_from_the_pool_and_answers_alike(pair: list[str]) -> None:
    a, b = pair
    doc = "A long shared document about prefix caching. " * 20  # ~230 tokens
    async with httpx.AsyncClient() as client:
        first = await _chat(client, a, doc)
        second = await _chat(client, b, doc)
        assert _cached(first) == 0 and _cached(second) >= TINY.chunk_tokens
        assert _content(second) == _content(first)
        metrics = (await client.get(b + "/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert set(families) >= VLLM_NAMES
    hits = {s.name: s.value for f in families.values() for s in f.samples}
    assert hits["vllm:external_prefix_cache_hits_total"] == _cached(second)
    assert hits["vllm:prefix_cache_hits_total"] == 0
    config = families["vllm:cache_config_info"].samples[0].labels
    assert config["block_size"] == "16"


async def test_corrupt_pool_fault_makes_pool_loaded_replies_differ(pair: list[str]) -> None:
    a, b = pair
    async with httpx.AsyncClient() as client:
        resp = await client.post(b + "/_emulator/faults", json={"corrupt_pool": True})
        assert resp.json()["faults"]["corrupt_pool"] is True
        doc = "Validate shared caching, do not assume it. " * 20
        good = await _chat(client, a, doc)
        bad = await _chat(client, b, doc)
        assert _cached(bad) > 0 and _content(bad) != _content(good)
        cold = await _chat(client, b, "no pool load for this one " * 20)
        assert _content(cold) == _content(await _chat(client, a, "no pool load for this one " * 20))
        await client.post(b + "/_emulator/faults", json={})
        again = await _chat(client, b, doc)  # a GPU hit on b now; the fault is off
        assert _content(again) == _content(good)


async def test_pool_off_replicas_recompute() -> None:
    replicas = [model_replica(n, TINY, None, model=MODEL, time_scale=0.01) for n in "ab"]
    doc = "Nothing is shared without a pool. " * 20
    try:
        async with LoopServers([create_replica_app(r) for r in replicas]) as (a, b), \
                httpx.AsyncClient() as client:
            await _chat(client, a, doc)
            assert _cached(await _chat(client, b, doc)) == 0
            assert _cached(await _chat(client, b, doc)) > 0  # its own GPU cache
    finally:
        for r in replicas:
            close_replica(r)


async def test_a_replica_built_later_on_the_same_pool_still_sees_its_chunks() -> None:
    """Replicas of one in-process pool share one model clock: built 0.3 s apart (30 model
    seconds at this scale), the later one still finds a chunk the first just stored."""
    pool = PoolRegistry().resolve("shared", TINY)
    start = time.monotonic()
    first = model_replica("a", TINY, pool, model=MODEL, time_scale=0.01, start=start)
    time.sleep(0.3)
    later = model_replica("b", TINY, pool, model=MODEL, time_scale=0.01, start=start)
    try:
        async with LoopServers([create_replica_app(r) for r in (first, later)]) as (a, b), \
                httpx.AsyncClient() as client:
            doc = "A document both replicas read. " * 20
            assert _cached(await _chat(client, a, doc)) == 0
            assert _cached(await _chat(client, b, doc)) >= TINY.chunk_tokens
    finally:
        close_replica(first)
        close_replica(later)
