"""Bad input: every refusal is OpenAI-shaped, has the right status, and loses nothing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from servers import Server, router

MODEL = "emulated-27b"
GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def lm(two_replicas: list[Server]) -> Iterator[Server]:
    server = router([r.url for r in two_replicas], "--max-body-bytes", "4096").start()
    yield server
    server.stop()


def _assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", b"{not json", None),
        ("/v1/chat/completions", b"[1, 2]", None),
        ("/v1/chat/completions", b"", None),
        # vLLM's lax typing: a missing model, "stream": "yes", "max_tokens": "9" are fine
        # (tests/router/test_body_limits.py); these are not.
        ("/v1/chat/completions",
         b'{"model": ["m"], "messages": [{"role": "user", "content": "x"}]}', "model"),
        ("/v1/chat/completions", b'{"model": 7, "messages": []}', "model"),
        ("/v1/chat/completions", b'{"model": "m"}', "messages"),
        ("/v1/chat/completions", b'{"model": "m", "messages": "hi"}', "messages"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"content": "x"}]}', "messages"),
        ("/v1/chat/completions",
         b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        ("/v1/chat/completions",
         b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "perhaps"}',
         "stream"),
        ("/v1/chat/completions",
         b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "nine"}',
         "max_tokens"),
        ("/v1/chat/completions",
         b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
         "temperature"),
        ("/v1/completions", b'{"model": "m"}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": {"a": 1}}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": [1, "a"]}', "prompt"),
    ],
)
def test_bad_bodies_get_400(lm: Server, path: str, body: bytes, param: str | None) -> None:
    r = httpx.post(lm.url + path, content=body, headers={"content-type": "application/json"})
    _assert_openai_error(r, 400, param)


def test_body_over_limit_gets_413(lm: Server) -> None:
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * 5000}]}
    _assert_openai_error(httpx.post(lm.url + "/v1/chat/completions", json=big), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: caught while streaming in
        yield b'{"model": "m", "prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    _assert_openai_error(httpx.post(lm.url + "/v1/completions", content=chunks()), 413)


def test_unknown_route_and_method(lm: Server) -> None:
    _assert_openai_error(httpx.get(lm.url + "/v1/nothing"), 404)
    r = httpx.get(lm.url + "/v1/chat/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_worker_survives_and_counts_refusals(lm: Server) -> None:
    for _ in range(20):
        httpx.post(lm.url + "/v1/chat/completions", content=b"\xff\xfe garbage")
    assert httpx.post(lm.url + "/v1/chat/completions", json=GOOD).status_code == 200
    assert 'lmroute_client_errors_total{code="invalid_json"}' in httpx.get(lm.url + "/metrics").text
