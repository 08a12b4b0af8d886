"""A replica killed under load: no request fails, the dead one is ejected."""

from __future__ import annotations

import asyncio

import httpx
from chaos import chat, fire
from servers import replica, router


def test_replica_killed_under_load(start_servers) -> None:
    reps = [start_servers(replica("--tpot", "0.005")) for _ in range(3)]
    lm = start_servers(router([r.url for r in reps], "--policy", "round_robin",
                              "--health-interval-s", "0.2"))
    url = lm.url + "/v1/chat/completions"

    async def scenario() -> list[httpx.Response | Exception]:
        load = asyncio.create_task(fire(url, [chat(f"load {i}", max_tokens=8)
                                              for i in range(300)], concurrency=8))
        await asyncio.sleep(0.5)
        await asyncio.to_thread(reps[0].kill)
        return await load

    replies = asyncio.run(scenario())
    failed = [r for r in replies if not (isinstance(r, httpx.Response) and r.status_code == 200)]
    assert failed == []
    state = httpx.get(lm.url + "/replicas").json()["replicas"]
    assert [r["healthy"] for r in state] == [False, True, True]
    assert sum(r["in_flight"] for r in state) == 0
