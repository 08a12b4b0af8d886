"""The admin API on a real router: auth, and switching policies with requests in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import orjson
import pytest

try:
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica, router

KEY = "s3cret-admin"


def _auth(key: str = KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _chat(session: str) -> bytes:
    return orjson.dumps({"model": "emulated-27b", "stream": True, "max_tokens": 4,
                         "messages": [{"role": "user", "content": f"hello from {session}"}]})


@pytest.fixture
def deployment(start_servers: Callable[[Server], Server]) -> tuple[str, list[str]]:
    # A slow first token (0.4 s) keeps requests in flight while the policy is switched.
    reps = [start_servers(replica("--ttft", "0.4", "--tpot", "0.01")) for _ in range(2)]
    urls = [r.url for r in reps]
    rt = start_servers(router(urls, "--admin-key", KEY, "--policy", "fixed"))
    return rt.url, urls


def test_admin_api_is_off_without_a_key(start_servers: Callable[[Server], Server],
                                        two_replicas: list[Server]) -> None:
    rt = start_servers(router([s.url for s in two_replicas]))
    resp = httpx.get(rt.url + "/admin/policy", headers=_auth())
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_401_without_or_with_a_wrong_key(deployment: tuple[str, list[str]]) -> None:
    url, _ = deployment
    for headers in ({}, _auth("wrong"), {"authorization": KEY}):
        # The internal routes sit behind the same key (router/gate.py).
        for method, path in (("GET", "/admin/policy"), ("POST", "/admin/policy"),
                             ("POST", "/admin/split/weights"), ("GET", "/replicas"),
                             ("GET", "/policy"), ("POST", "/index/lookup")):
            resp = httpx.request(method, url + path, headers=headers, json={"policy": "fixed"})
            assert resp.status_code == 401
            err = resp.json()["error"]
            assert err["type"] == "authentication_error" and set(err) == {
                "message", "type", "param", "code"}
    assert httpx.get(url + "/admin/policy", headers=_auth()).json()["policy"] == "fixed"
    assert httpx.get(url + "/replicas", headers=_auth()).json()["policy"] == "fixed"


def test_bad_switches_are_refused_and_change_nothing(deployment: tuple[str, list[str]]) -> None:
    url, _ = deployment
    for body in ({"policy": "nope"}, {"policy": "split"}, {"policy": "locality",
                                                            "options": {"stay_margin": "x"}},
                 {"policy": "locality", "options": {"prior": "/nonexistent/prior.toml"}},
                 {"policy": 3}):
        resp = httpx.post(url + "/admin/policy", headers=_auth(), json=body)
        assert resp.status_code == 400, body
    resp = httpx.post(url + "/admin/split/weights", headers=_auth(), json={"weights": {"A": 1}})
    assert resp.status_code == 400  # the active policy is not a split
    assert httpx.get(url + "/admin/policy", headers=_auth()).json()["policy"] == "fixed"


async def _stream(client: httpx.AsyncClient, url: str, session: str) -> tuple[int, str, str]:
    async with client.stream("POST", url + "/v1/chat/completions", content=_chat(session),
                             headers={"x-session-id": session,
                                      "content-type": "application/json"}) as resp:
        body = b"".join([c async for c in resp.aiter_bytes()])
        assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
        return resp.status_code, resp.headers.get("x-lmroute-arm", ""), \
            resp.headers.get("x-lmroute-policy", "")


def test_switching_with_requests_in_flight_drops_none(deployment: tuple[str, list[str]]) -> None:
    url, _ = deployment

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30.0) as client:
            async def switch(body: dict[str, object], path: str = "/admin/policy") -> None:
                resp = await client.post(url + path, headers=_auth(), json=body)
                assert resp.status_code == 200, resp.text

            waves = []
            for k, body in enumerate([
                    {"policy": "round_robin"},
                    {"policy": "split", "options": {"spec": "A=fixed:50,B=round_robin:50"}},
                    {"policy": "locality", "options": {"stay_margin": 0.3}},
                    {"policy": "split", "split": "A=fixed:100,B=round_robin:0,salt=t"}]):
                waves.append([asyncio.create_task(_stream(client, url, f"w{k}-{i}"))
                              for i in range(8)])
                await asyncio.sleep(0.1)  # all 8 are waiting for their first token
                await switch(body)
            results = [await t for wave in waves for t in wave]
            assert [r[0] for r in results] == [200] * 32
            # The last wave started under locality: no arm; the split's requests carry one.
            assert {r[1] for r in results[24:]} == {""}
            # Every session now lands in arm A; re-weighting sends new sessions to B.
            now = [await _stream(client, url, f"x{i}") for i in range(6)]
            assert {r[1] for r in now} == {"A"} and {r[2] for r in now} == {"split"}
            in_flight = [asyncio.create_task(_stream(client, url, f"y{i}")) for i in range(6)]
            await asyncio.sleep(0.1)
            await switch({"weights": {"A": 0, "B": 1}}, "/admin/split/weights")
            assert {r[1] for r in [await t for t in in_flight]} == {"A"}
            assert {r[1] for r in [await _stream(client, url, f"z{i}") for i in range(6)]} == {"B"}
            state = (await client.get(url + "/admin/policy", headers=_auth())).json()
            assert state["policy"] == "split" and state["switches"] == 5
            assert [a["weight"] for a in state["state"]["arms"]] == [0.0, 1.0]
            # The router's in-flight bookkeeping came back to zero on every replica.
            replicas = (await client.get(url + "/replicas", headers=_auth())).json()["replicas"]
            assert [r["in_flight"] for r in replicas] == [0, 0]
            metrics = (await client.get(url + "/metrics")).text
            assert 'arm="A"' in metrics and 'arm="B"' in metrics and 'arm=""' in metrics

    asyncio.run(main())
