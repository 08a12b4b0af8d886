"""Tenants on a real router: keys, isolation of the index and the engines' caches, limits.

Emulated replicas run the `tiny` model (a prefix cache and a pool, reporting
``cached_tokens`` as vLLM does) with a larger GPU so nothing is evicted during a test; the
router runs ``prefix_affinity`` (reason ``gpu-hit`` when the index knows the prefix).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from servers import Server, replica, router
from servers_redis import free_port

from router.tenants import TenantFileError, Tenants, combine

MODEL = "emulated-27b"
N_DOCS = 8
DOCS = [f"Contract {i}: " + " ".join(f"clause-{i}-{j}" for j in range(60)) for i in range(N_DOCS)]
TENANTS = """
[tenants.acme]
keys = ["sk-acme-1", "sk-acme-2"]
cache_group = "shared-docs"

[tenants.globex]
keys = ["sk-globex"]

[tenants.initech]
keys = ["sk-initech"]
cache_group = "shared-docs"

[tenants.small]
keys = ["sk-small"]
max_concurrency = 2

[tenants.slow]
keys = ["sk-slow"]
requests_per_minute = 2
"""
PROFILE = 'base = "tiny"\nname = "tiny-big"\ngpu_kv_bytes = 16777216\npool_bytes = 16777216\n'


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _chat(doc: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "system", "content": doc},
                         {"role": "user", "content": "Summarise."}], **extra}


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    return path


@pytest.fixture
def tenant_router(start_servers: Callable[[Server], Server], keys_file: Path,
                  tmp_path: Path) -> Server:
    profile = tmp_path / "tiny-big.toml"
    profile.write_text(PROFILE)
    reps = [start_servers(replica("--profile", str(profile), "--time-scale", "0.01"))
            for _ in range(2)]
    return start_servers(router([r.url for r in reps], "--api-keys", str(keys_file),
                                "--policy", "prefix_affinity", "--block-bytes", "128"))


def _send(url: str, key: str, body: dict[str, Any]) -> tuple[str, int]:
    """(routing reason, cached prompt tokens the engine reported)."""
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=_auth(key), timeout=30)
    assert r.status_code == 200, r.text
    return r.headers["x-lmroute-reason"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _settle(url: str, key: str, doc: str) -> None:
    """The index records a served prefix in the background: repeat until it is a hit."""
    for _ in range(100):
        if _send(url, key, _chat(doc))[0] == "gpu-hit":
            return
    raise AssertionError("the index never learnt a served prefix")


def test_no_prefix_is_shared_across_tenants_unless_they_share_a_cache_group(
        tenant_router: Server) -> None:
    url = tenant_router.url
    for doc in DOCS:
        _send(url, "sk-acme-1", _chat(doc))
    for doc in DOCS:
        _settle(url, "sk-acme-2", doc)  # a tenant's second key is the same tenant
    # Control: the same tenant's repeat hits both the index and the engine's cache.
    same = [_send(url, "sk-acme-1", _chat(doc)) for doc in DOCS]
    assert all(reason == "gpu-hit" and cached > 0 for reason, cached in same)
    # Another tenant sending the same prompts, even with a cache_salt of its own: no hit
    # in the router's index, none in the engines' prefix caches or the pool.
    other = [_send(url, "sk-globex", _chat(doc)) for doc in DOCS[:4]]
    other += [_send(url, "sk-globex", _chat(doc, cache_salt="guess")) for doc in DOCS[4:]]
    print(f"cross-tenant: index hits {sum(r == 'gpu-hit' for r, _ in other)} of {N_DOCS}, "
          f"engine cache hits {sum(c > 0 for _, c in other)} of {N_DOCS}; same tenant "
          f"{sum(r == 'gpu-hit' and c > 0 for r, c in same)} of {N_DOCS}")
    assert sum(reason == "gpu-hit" for reason, _ in other) == 0
    assert sum(cached > 0 for _, cached in other) == 0
    # A tenant naming the same cache_group shares the prefixes.
    group = [_send(url, "sk-initech", _chat(doc)) for doc in DOCS]
    assert all(reason == "gpu-hit" and cached > 0 for reason, cached in group)


def test_every_request_needs_a_tenant_key(tenant_router: Server) -> None:
    url = tenant_router.url
    body = _chat(DOCS[0])
    for headers in ({}, _auth("sk-nope"), {"authorization": "sk-acme-1"}):
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
            r = httpx.request(method, url + path, json=body, headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["type"] == "authentication_error"
            assert "sk-nope" not in r.text and "sk-acme-1" not in r.text
    assert httpx.get(url + "/v1/models", headers=_auth("sk-globex")).status_code == 200
    assert httpx.get(url + "/health").status_code == 200
    # With tenants and no admin key, the internal routes are nobody's, a tenant's key
    # included.
    for method, path in (("GET", "/replicas"), ("GET", "/policy"), ("POST", "/index/lookup"),
                         ("GET", "/admin/policy")):
        r = httpx.request(method, url + path, json=body, headers=_auth("sk-acme-1"))
        assert r.status_code == 404, path
    # Replies name replicas by position, not by URL.
    r = httpx.post(url + "/v1/chat/completions", json=body, headers=_auth("sk-globex"))
    assert r.headers["x-lmroute-replica"] in {"r0", "r1"}


async def test_concurrency_limit_answers_429_and_frees_the_slot(
        start_servers: Callable[[Server], Server], keys_file: Path) -> None:
    # A 0.5 s first token keeps requests in flight.
    rep = start_servers(replica("--ttft", "0.5", "--tpot", "0.01"))
    url = start_servers(router([rep.url], "--api-keys", str(keys_file))).url
    body = {**_chat("hi"), "stream": True}
    async with httpx.AsyncClient(timeout=30) as client:
        async def one() -> httpx.Response:
            r = await client.post(url + "/v1/chat/completions", json=body,
                                  headers=_auth("sk-small"))
            await r.aread()
            return r

        first = [asyncio.create_task(one()) for _ in range(2)]
        await asyncio.sleep(0.2)  # both admitted and waiting for their first token
        third = await one()
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert [(await t).status_code for t in first] == [200, 200]
        # A client that leaves mid-stream gives its slot back too.
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers=_auth("sk-small")) as gone:
            assert gone.status_code == 200
        await asyncio.sleep(0.8)
        again = await asyncio.gather(one(), one())
        assert [r.status_code for r in again] == [200, 200]


def test_rate_limit_answers_429_with_retry_after(start_servers: Callable[[Server], Server],
                                                 keys_file: Path) -> None:
    rep = start_servers(replica())
    url = start_servers(router([rep.url], "--api-keys", str(keys_file))).url
    statuses = [httpx.post(url + "/v1/chat/completions", json=_chat("hi"),
                           headers=_auth("sk-slow")) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    # 2 per minute: the next token is due in 30 s.
    assert 1 <= int(statuses[2].headers["retry-after"]) <= 30
    assert statuses[2].json()["error"]["type"] == "rate_limit_error"
    # Other tenants are not limited by it.
    assert httpx.post(url + "/v1/chat/completions", json=_chat("hi"),
                      headers=_auth("sk-globex")).status_code == 200


def test_tenant_file_is_checked_and_salts_follow_cache_groups(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(TENANTS)
    tenants = Tenants.from_file(path)
    acme, initech, globex = (tenants.lookup(k) for k in ("sk-acme-2", "sk-initech", "sk-globex"))
    assert acme is not None and initech is not None and globex is not None
    assert acme.salt == initech.salt != globex.salt
    assert tenants.lookup("sk-acme") is None
    # A client's salt never reproduces a tenant's: combined, hashed.
    assert combine(globex.salt, acme.salt) not in {acme.salt, globex.salt}
    assert combine(globex.salt, None) == globex.salt
    for bad in ('[tenants.a]\nkeys = []\n', '[tenants.a]\nkeys = ["k"]\nmax_concurrency = 0\n',
                '[tenants.a]\nkeys = ["k"]\n[tenants.b]\nkeys = ["k"]\n',
                '[tenants.a]\nkeys = ["k"]\nrate = 3\n', 'x = 1\n'):
        path.write_text(bad)
        with pytest.raises(TenantFileError):
            Tenants.from_file(path)


class _Recorder(BaseHTTPRequestHandler):
    """A bare upstream that records what reaches it (what a replica would see)."""

    seen: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []

    def _answer(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append((self.path, dict(self.headers), b""))
        self._answer({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.seen.append((self.path, dict(self.headers), body))
        self._answer({"id": "x", "object": "chat.completion", "choices": []})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_tenant_keys_stay_at_the_router_and_the_salt_goes_on(
        start_servers: Callable[[Server], Server], keys_file: Path, recorder: str) -> None:
    url = start_servers(router([recorder], "--api-keys", str(keys_file))).url
    _Recorder.seen.clear()
    assert httpx.post(url + "/v1/chat/completions", json=_chat("hi", cache_salt="mine"),
                      headers=_auth("sk-globex")).status_code == 200
    assert httpx.get(url + "/v1/models", headers=_auth("sk-globex")).status_code == 200
    sent = [(path, headers, body) for path, headers, body in _Recorder.seen
            if path.startswith("/v1/")]
    assert {path for path, _, _ in sent} == {"/v1/chat/completions", "/v1/models"}
    assert all("sk-globex" not in str(headers) for _, headers, _ in sent)
    body = json.loads(next(b for p, _, b in sent if p == "/v1/chat/completions"))
    globex = Tenants.from_file(keys_file).lookup("sk-globex")
    assert globex is not None and body["cache_salt"] == combine(globex.salt, "mine")
    assert body["messages"] == _chat("hi")["messages"]
