"""Bodies and headers a client controls, on a real router: size, encoding, nesting, ranges,
vLLM's leniency, session keys, malformed HTTP.

One router (admin key set, so every body-accepting route exists) with a 64 KiB body limit
in front of one emulated replica.
"""

from __future__ import annotations

import gzip
import json
import socket
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from servers import Server, replica, router

MODEL = "emulated-27b"
KEY = "admin-secret"
LIMIT = 65_536
BODY_ROUTES = ["/v1/chat/completions", "/v1/completions", "/index/lookup", "/admin/policy",
               "/admin/split/weights"]


@pytest.fixture(scope="module")
def lm() -> Iterator[Server]:
    rep = replica("--max-model-len", "4096").start()
    server = router([rep.url], "--admin-key", KEY, "--max-body-bytes", str(LIMIT)).start()
    yield server
    server.stop()
    rep.stop()


def _post(lm: Server, path: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(lm.url + path, content=content, timeout=30,
                      headers={"authorization": f"Bearer {KEY}",
                               "content-type": "application/json", **headers})


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 3,
            "messages": [{"role": "user", "content": "hello"}], **extra}


def test_every_body_route_refuses_oversized_deep_and_bomb_bodies(lm: Server) -> None:
    big = orjson.dumps(_chat(pad="x" * LIMIT))
    # 300 levels: orjson (the router's serializer) writes at most 254.
    deep = orjson.dumps({**_chat(), "prompt": "p"})[:-1] + b', "policy": ' \
        + b"[" * 300 + b"]" * 300 + b"}"
    # 1 MiB of zeros compresses to about 1 KiB: well under the limit on the wire.
    bomb = gzip.compress(b'{"pad": "' + b"0" * (1 << 20) + b'"}')
    assert len(bomb) < LIMIT
    for path in BODY_ROUTES:
        r = _post(lm, path, big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", path
        r = _post(lm, path, deep)
        assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep", path
        r = _post(lm, path, bomb, **{"content-encoding": "gzip"})
        assert r.status_code == 413, path
        r = _post(lm, path, b"\x1f\x8b garbage", **{"content-encoding": "gzip"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_encoding", path
        r = _post(lm, path, b"{}", **{"content-encoding": "br"})
        assert r.status_code == 415, path


def test_compressed_bodies_are_decoded(lm: Server) -> None:
    raw = orjson.dumps(_chat())
    plain = _post(lm, "/v1/chat/completions", raw).json()["choices"][0]["message"]["content"]
    for encoding, data in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw)),
                           ("deflate", zlib.compress(raw)[2:-4]),  # raw deflate
                           ("gzip, identity", gzip.compress(raw))):
        r = _post(lm, "/v1/chat/completions", data, **{"content-encoding": encoding})
        assert r.status_code == 200, (encoding, r.text)
        assert r.json()["choices"][0]["message"]["content"] == plain


@pytest.mark.parametrize("body", [
    {"model": MODEL, "prompt": [1, 2**32], "max_tokens": 2},
    {"model": MODEL, "prompt": [[5, -1]], "max_tokens": 2},
    {"model": MODEL, "prompt": [2**70], "max_tokens": 2},
    {"model": MODEL, "prompt": "p", "max_tokens": -5},
    {"model": MODEL, "prompt": "p", "max_tokens": 2.5},
    {"model": MODEL, "prompt": "p", "temperature": "warm"},
    {"model": MODEL, "prompt": "p", "cache_salt": ""},
    {"model": 3, "prompt": "p"},
    {"model": MODEL},
])
def test_what_vllm_refuses_is_a_400(lm: Server, body: dict[str, Any]) -> None:
    r = _post(lm, "/v1/completions", json.dumps(body).encode())  # orjson stops at 64 bits
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body", [
    {"model": MODEL, "prompt": "p", "temperature": "0.5", "top_p": 1, "max_tokens": "3"},
    {"model": MODEL, "prompt": "p", "n": 2.0, "max_tokens": 3.0, "stream": "false"},
    {"prompt": "no model: the served one", "max_tokens": 3},
    {"model": MODEL, "prompt_embeds": "AAAAAA==", "max_tokens": 3},
    {"model": MODEL, "prompt": [0, 2**32 - 1], "max_tokens": 3},
])
def test_what_vllm_accepts_is_served(lm: Server, body: dict[str, Any]) -> None:
    r = _post(lm, "/v1/completions", orjson.dumps(body))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"]


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_huge_session_ids_do_not_stay_in_memory(lm: Server) -> None:
    assert lm.proc is not None
    raw = orjson.dumps(_chat())
    with httpx.Client(timeout=30) as client:
        for i in range(5):  # warm-up: allocator pools, first-request imports
            client.post(lm.url + "/v1/chat/completions", content=raw,
                        headers={"x-session-id": f"{i}" * 1000})
        before = _rss_kib(lm.proc.pid)
        for i in range(100):
            r = client.post(lm.url + "/v1/chat/completions", content=raw,
                            headers={"x-session-id": f"{i:03d}" + "s" * (1 << 20)})
            assert r.status_code == 200
        growth_mib = (_rss_kib(lm.proc.pid) - before) / 1024
    print(f"router RSS growth after 100 requests with distinct 1 MiB X-Session-IDs: "
          f"{growth_mib:.1f} MiB")
    # 100 distinct 1 MiB session ids; kept whole they held 100+ MiB (issue 13).
    assert growth_mib < 24, growth_mib


def _raw_http(lm: Server, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", lm.port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("request_bytes", [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
])
def test_malformed_http_gets_an_openai_shaped_400(lm: Server, request_bytes: bytes) -> None:
    reply = _raw_http(lm, request_bytes)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"content-type: application/json" in head.lower()
    assert orjson.loads(body)["error"]["code"] == "malformed_http"
