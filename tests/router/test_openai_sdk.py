"""The official openai SDK, sync and async, streamed and not, against `lmroute serve`."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from servers import Server, router

MODEL = "emulated-27b"


@pytest.fixture(scope="module")
def lmroute(two_replicas: list[Server]) -> Iterator[Server]:
    server = router([r.url for r in two_replicas], "--policy", "round_robin",
                    "--expose-replica-header").start()
    yield server
    server.stop()


def test_chat_non_streamed(lmroute: Server, two_replicas: list[Server]) -> None:
    client = openai.OpenAI(base_url=lmroute.url + "/v1", api_key="unused")
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=7
    )
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    assert raw.headers["x-lmroute-policy"] == "round_robin"
    assert raw.headers["x-lmroute-replica"] in {r.url for r in two_replicas}
    assert raw.headers["x-lmroute-reason"] == "round-robin"
    direct = openai.OpenAI(base_url=raw.headers["x-lmroute-replica"] + "/v1", api_key="x")
    same = direct.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=7
    )
    assert same.choices[0].message.content == reply.choices[0].message.content


def test_chat_streamed_with_usage(lmroute: Server) -> None:
    client = openai.OpenAI(base_url=lmroute.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count"}], max_tokens=5,
        stream=True, stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert len([p for p in pieces if p]) == 5
    assert usage is not None and usage.completion_tokens == 5


async def test_async_completions_streamed_and_not(lmroute: Server) -> None:
    client = openai.AsyncOpenAI(base_url=lmroute.url + "/v1", api_key="unused")
    whole = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4)
    text = whole.choices[0].text
    streamed = await client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4,
                                               stream=True)
    joined = "".join([c.choices[0].text async for c in streamed if c.choices])
    assert joined == text  # same prompt, same deterministic reply, whichever replica
    await client.close()


def test_models_is_union_of_replicas(lmroute: Server) -> None:
    client = openai.OpenAI(base_url=lmroute.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [MODEL]


def test_sdk_sees_openai_errors(lmroute: Server) -> None:
    client = openai.OpenAI(base_url=lmroute.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[])
    assert info.value.status_code == 400
    assert info.value.param == "messages"
    with pytest.raises(openai.NotFoundError):  # the replica's 404 passes through unchanged
        client.chat.completions.create(model="no-such-model",
                                       messages=[{"role": "user", "content": "x"}])


def test_health_ready_replicas_metrics(lmroute: Server) -> None:
    assert httpx.get(lmroute.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(lmroute.url + "/ready")
    assert ready.status_code == 200 and ready.json()["healthy_replicas"] == 2
    reps = httpx.get(lmroute.url + "/replicas").json()["replicas"]
    assert [r["healthy"] for r in reps] == [True, True]
    assert all("num_requests_waiting" in r["scraped"] for r in reps)
    text = httpx.get(lmroute.url + "/metrics").text
    assert "lmroute_requests_total" in text and "lmroute_replica_healthy" in text
