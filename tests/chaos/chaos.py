"""Helpers shared by the chaos tests: polling, metric reading, concurrent load."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

CHAT = {"model": "emulated-27b", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 2}


def chat(text: str, max_tokens: int = 2, **extra: Any) -> dict[str, Any]:
    return {**CHAT, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            **extra}


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, every_s: float = 0.02) -> float:
    """Poll until ``predicate()``; the seconds it took (AssertionError past the timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(every_s)
    raise AssertionError(f"condition not reached in {timeout_s}s")


def metric(url: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` at ``url``/metrics whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def in_flight(router_url: str, headers: dict[str, str] | None = None) -> int:
    replicas = httpx.get(router_url + "/replicas", headers=headers, timeout=5).json()["replicas"]
    return sum(int(r["in_flight"]) for r in replicas)


async def fire(url: str, bodies: list[dict[str, Any]], *, concurrency: int = 16,
               headers: dict[str, str] | None = None, timeout_s: float = 60.0
               ) -> list[httpx.Response | Exception]:
    """POST each body to ``url`` with at most ``concurrency`` in flight; replies in order."""
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def one(body: dict[str, Any]) -> httpx.Response | Exception:
            async with sem:
                try:
                    return await client.post(url, json=body, headers=headers)
                except httpx.HTTPError as exc:
                    return exc

        return list(await asyncio.gather(*(one(b) for b in bodies)))


def run_fire(url: str, bodies: list[dict[str, Any]], **kw: Any) -> list[httpx.Response | Exception]:
    return asyncio.run(fire(url, bodies, **kw))


async def streams(url: str, n: int, started: asyncio.Event) -> list[str]:
    """``n`` streams of 40 tokens each; sets ``started`` once all have their first bytes."""
    got_first = 0

    async def one(client: httpx.AsyncClient, i: int) -> str:
        nonlocal got_first
        text = b""
        async with client.stream("POST", url + "/v1/chat/completions",
                                 json=chat(f"stream {i}", max_tokens=40, stream=True)) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_bytes():
                if not text:
                    got_first += 1
                    if got_first == n:
                        started.set()
                text += chunk
        return text.decode()

    limits = httpx.Limits(max_connections=n + 1)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return list(await asyncio.gather(*(one(client, i) for i in range(n))))
