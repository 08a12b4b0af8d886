"""Real vLLM's usage, read by the router: ``--enable-prompt-tokens-details`` makes vLLM
report ``usage.prompt_tokens_details.cached_tokens``; ``router.usage`` reads it off the
reply's tail, and ``locality`` does not learn from a reply whose engine cached what the
router's index did not know (a prompt sent to the replica past the router). Approximate
mode (no KV events), one replica behind the router, non-streamed and streamed with usage.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from servers import Server, router
from vllm_servers import MODEL_NAME, VllmServer

pytestmark = pytest.mark.vllm
KEY = "e2e-usage"


def _doc(tag: str) -> str:
    return " ".join(f"{tag}{i} kaloe mine ruvo" for i in range(150))  # ~2,000 tokens


@pytest.fixture(scope="module")
def lm(engines: list[VllmServer]) -> Iterator[Server]:
    server = router([engines[0].url], "--policy", "locality", "--admin-key", KEY,
                    "--pool-bytes", "0").start(timeout_s=60)
    yield server
    server.stop()


def _send(url: str, tag: str, **extra: Any) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": _doc(tag), "max_tokens": 2, **extra}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp


def _state(lm: Server) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(lm.url + "/policy", timeout=10,
                                    headers={"authorization": f"Bearer {KEY}"}).json()
    return out


def test_a_prompt_vllm_cached_past_the_router_teaches_calibration_nothing(
        lm: Server, engines: list[VllmServer]) -> None:
    direct = _send(engines[0].url, "usage-a").json()["usage"]
    assert direct["prompt_tokens_details"] is not None, "vLLM runs without details"
    again = _send(engines[0].url, "usage-a").json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] > 0.8 * again["prompt_tokens"]
    _send(lm.url, "usage-a")  # the router's index: a miss; vLLM: nearly all cached
    assert _state(lm)["unexplained_replies"] == 1
    _send(lm.url, "usage-b")  # new to both: explained, and learnt from
    state = _state(lm)
    assert state["unexplained_replies"] == 1
    assert state["calibration"]["observations"] >= 1
    _send(engines[0].url, "usage-c")
    stream = _send(lm.url, "usage-c", stream=True, stream_options={"include_usage": True})
    assert '"cached_tokens"' in stream.text
    assert _state(lm)["unexplained_replies"] == 2
