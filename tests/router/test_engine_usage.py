"""The engine's own count of cached tokens: read off replies, and what the policy does with
it (a reply whose engine cached what the router's index did not know teaches calibration
nothing)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson

try:
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica, router

from router.usage import engine_usage

KEY = "usage-admin"


def test_usage_is_read_from_the_tail_of_a_reply_in_every_shape() -> None:
    vllm = (b'{"id":"cmpl-1","choices":[{"text":"hi"}],"usage":{"prompt_tokens":8192,'
            b'"total_tokens":8200,"completion_tokens":8,"prompt_tokens_details":'
            b'{"cached_tokens":7936}},"kv_transfer_params":null}')
    assert engine_usage(vllm) == (8192, 7936)
    spaced = b'"usage": {"prompt_tokens": 12, "prompt_tokens_details": {"cached_tokens": 0}}}'
    assert engine_usage(spaced) == (12, 0)
    # vLLM without --enable-prompt-tokens-details, and a reply without usage.
    assert engine_usage(b'"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}') is None
    assert engine_usage(b'{"choices":[{"text":"x"}]}') is None
    # A key inside generated text is escaped and never read as the engine's.
    text = b'{"text":"\\"cached_tokens\\": 99, \\"prompt_tokens\\": 100","usage":null}'
    assert engine_usage(text) is None
    # A stream's tail: the usage event, then [DONE]; a long body's first bytes are not read.
    stream = (b'data: {"choices":[],"usage":{"prompt_tokens":300,"completion_tokens":2,'
              b'"prompt_tokens_details":{"cached_tokens":256}}}\n\ndata: [DONE]\n\n')
    assert engine_usage(b"x" * 100_000 + stream) == (300, 256)
    assert engine_usage(b'"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":9}') is None


def _prompt(tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(2000))  # ~8 prefix blocks on the emulator


def _state(rt: Server) -> dict[str, object]:
    resp = httpx.get(rt.url + "/policy", headers={"authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200
    state: dict[str, object] = resp.json()
    return state


def _send(url: str, prompt: str, *, stream: bool = False, usage: bool = False) -> None:
    body: dict[str, object] = {"model": "emulated-27b", "prompt": prompt, "max_tokens": 2,
                               "stream": stream}
    if usage:
        body["stream_options"] = {"include_usage": True}
    resp = httpx.post(url + "/v1/completions", content=orjson.dumps(body),
                      headers={"content-type": "application/json"}, timeout=30)
    assert resp.status_code == 200, resp.text
    if stream:
        assert resp.text.rstrip().endswith("data: [DONE]")


def test_a_reply_the_index_could_not_explain_teaches_calibration_nothing(
        start_servers: Callable[[Server], Server]) -> None:
    """A prompt sent to the replica past the router (another router's client, in
    production) is cached there unknown to the router's index; the router then predicts a
    miss and vLLM's usage says most of it was cached. Non-streamed, and streamed when the
    client asks for usage, that reply is not learnt from; one the index explains is."""
    rep = start_servers(replica("--profile", "study-27b", "--time-scale", "0.01"))
    rt = start_servers(router([rep.url], "--admin-key", KEY, "--policy", "locality"))

    _send(rep.url, _prompt("a"))  # past the router
    _send(rt.url, _prompt("a"))
    state = _state(rt)
    assert state["unexplained_replies"] == 1

    _send(rt.url, _prompt("b"))  # new everywhere: the engine computes what the index said
    after = _state(rt)
    assert after["unexplained_replies"] == 1
    assert after["calibration"]["observations"] == 1  # type: ignore[index]

    _send(rep.url, _prompt("c"))
    _send(rt.url, _prompt("c"), stream=True, usage=True)
    assert _state(rt)["unexplained_replies"] == 2

    # Streamed without usage: nothing says the index was wrong, so it teaches as before.
    _send(rep.url, _prompt("d"))
    _send(rt.url, _prompt("d"), stream=True)
    last = _state(rt)
    assert last["unexplained_replies"] == 2
    assert last["calibration"]["observations"] == 2  # type: ignore[index]
