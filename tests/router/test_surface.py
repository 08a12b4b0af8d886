"""vLLM's whole surface through the router: every route passed through byte for byte,
streamed and not where it streams, with failover before the first byte; stored responses
reach the replica holding them; state-changing routes reach every replica."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis
from servers import Server, replica, router

ADMIN = {"authorization": "Bearer admin-key"}
MODEL = "emulated-27b"
AUDIO = b"RIFF" + bytes(range(256)) * 40  # not audio: the emulator hashes the bytes
BALANCED = [
    ("/tokenize", {"model": MODEL, "prompt": "count these tokens"}),
    ("/detokenize", {"model": MODEL, "tokens": [1, 2, 3]}),
    ("/v1/score", {"model": MODEL, "text_1": "q", "text_2": ["a", "b"]}),
    ("/score", {"model": MODEL, "text_1": "q", "text_2": "a"}),
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a", "b", "c"]}),
    ("/rerank", {"model": MODEL, "query": "q", "documents": ["a"]}),
    ("/v2/rerank", {"model": MODEL, "query": "q", "documents": ["a", "b"], "top_n": 1}),
    ("/classify", {"model": MODEL, "input": ["good", "bad"]}),
    ("/pooling", {"model": MODEL, "input": "pool me"}),
    ("/v1/embeddings", {"model": MODEL, "input": ["a", "b"], "encoding_format": "float"}),
    ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user",
                                                                 "content": "hi"}]}),
]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Server, Server, Server]]:
    """Two byte-reproducible replicas behind a round-robin router (so a request pinned to
    one replica only gets there by the router's own bookkeeping)."""
    a = replica("--fixed-created", "1700000000").start()
    b = replica("--fixed-created", "1700000000").start()
    lm = router([a.url, b.url], "--policy", "round_robin", "--expose-replica-header",
                "--admin-key", "admin-key").start()
    yield a, b, lm
    for s in (lm, a, b):
        s.stop()


def _client(lm: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=lm.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize(("path", "body"), BALANCED, ids=[p for p, _ in BALANCED])
def test_balanced_routes_pass_bytes_through(fleet, path: str, body: dict) -> None:
    a, b, lm = fleet
    seen = set()
    for i in range(2):
        headers = {"x-request-id": f"{path.strip('/').replace('/', '-')}-{i}"}
        routed = httpx.post(lm.url + path, json=body, headers=headers)
        assert routed.status_code == 200, routed.text
        direct = httpx.post(routed.headers["x-lmroute-replica"] + path, json=body,
                            headers=headers)
        assert routed.content == direct.content
        seen.add(routed.headers["x-lmroute-replica"])
    assert seen == {a.url, b.url}  # load-balanced: round robin over both


def test_version_and_unknown_route(fleet) -> None:
    _, _, lm = fleet
    assert httpx.get(lm.url + "/version").json() == {"version": "0.32.0"}
    missing = httpx.post(lm.url + "/v1/nothing/here", json={})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}


def test_embeddings_through_the_sdk(fleet) -> None:
    _, _, lm = fleet
    got = _client(lm).embeddings.create(model=MODEL, input=["one", "two"])  # base64 on the wire
    assert [len(d.embedding) for d in got.data] == [8, 8]
    assert got.usage.prompt_tokens > 0


def test_responses_create_retrieve_delete_reach_the_creator(fleet) -> None:
    _, _, lm = fleet
    client = _client(lm)
    raw = client.responses.with_raw_response.create(model=MODEL, input="hello",
                                                    max_output_tokens=4)
    created = raw.parse()
    holder = raw.headers["x-lmroute-replica"]
    assert created.output_text and created.status == "completed"
    for _ in range(3):  # round robin would alternate: the id map pins it
        again = client.responses.with_raw_response.retrieve(created.id)
        assert again.headers["x-lmroute-replica"] == holder
        assert again.parse().id == created.id
    follow = client.responses.with_raw_response.create(
        model=MODEL, input="and then?", previous_response_id=created.id, max_output_tokens=2)
    assert follow.headers["x-lmroute-replica"] == holder
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_responses_streamed_then_retrieved(fleet) -> None:
    _, _, lm = fleet
    client = _client(lm)
    events = list(client.responses.create(model=MODEL, input="stream it", stream=True,
                                          max_output_tokens=5))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") == 5
    done = events[-1].response
    assert client.responses.retrieve(done.id).output_text == done.output_text


def test_responses_cancel_reaches_the_creator(start_servers) -> None:
    a = start_servers(replica("--tpot", "0.2"))
    b = start_servers(replica("--tpot", "0.2"))
    lm = start_servers(router([a.url, b.url], "--policy", "round_robin"))
    client = _client(lm)
    started = client.responses.create(model=MODEL, input="long", background=True,
                                      max_output_tokens=100)
    assert started.status == "in_progress"
    assert client.responses.cancel(started.id).status == "cancelled"
    assert client.responses.retrieve(started.id).status == "cancelled"


@pytest.mark.parametrize("stream", [False, True])
def test_messages_bytes(fleet, stream: bool) -> None:
    _, _, lm = fleet
    body = {"model": MODEL, "max_tokens": 4, "stream": stream, "system": "be brief",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    headers = {"x-request-id": f"messages-{stream}"}
    routed = httpx.post(lm.url + "/v1/messages", json=body, headers=headers)
    direct = httpx.post(routed.headers["x-lmroute-replica"] + "/v1/messages", json=body,
                        headers=headers)
    assert routed.status_code == 200
    assert routed.content == direct.content
    if stream:
        assert routed.text.startswith("event: message_start\n")
        assert routed.text.endswith('event: message_stop\ndata: {"type":"message_stop"}\n\n')


def test_transcription_through_the_sdk(fleet) -> None:
    _, _, lm = fleet
    # (the SDK's translations resource is deprecated: translations are checked over HTTP)
    got = _client(lm).audio.transcriptions.create(model=MODEL,
                                                  file=("clip.wav", io.BytesIO(AUDIO)))
    assert len(got.text.split()) == 8


@pytest.mark.parametrize("stream", ["false", "true"])
@pytest.mark.parametrize("kind", ["transcriptions", "translations"])
def test_audio_bytes(fleet, kind: str, stream: str) -> None:
    _, _, lm = fleet
    path = f"/v1/audio/{kind}"
    form = {"model": MODEL, "stream": stream}
    headers = {"x-request-id": f"audio-{kind}-{stream}"}
    routed = httpx.post(lm.url + path, data=form, files={"file": ("a.wav", AUDIO)},
                        headers=headers)
    direct = httpx.post(routed.headers["x-lmroute-replica"] + path, data=form,
                        files={"file": ("a.wav", AUDIO)}, headers=headers)
    assert routed.status_code == 200
    assert routed.content == direct.content
    if stream == "true":
        assert routed.content.endswith(b"data: [DONE]\n\n")
    else:
        assert len(routed.json()["text"].split()) == 8


def test_upload_naming_an_unknown_model_is_404(fleet) -> None:
    _, _, lm = fleet
    r = httpx.post(lm.url + "/v1/audio/transcriptions", data={"model": "nope"},
                   files={"file": ("a.wav", AUDIO)})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The model `nope` does not exist."


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/load_lora_adapter"])
def test_a_model_that_is_not_a_string_is_400_at_the_replica_and_through(fleet, path) -> None:
    """vLLM's request schema refuses it (400); the emulated replica once raised on it (a
    dict is not hashable) and answered 500, which the router passed on as the replica's."""
    a, _, lm = fleet
    body = {"model": {"not": "a name"}, "input": "x", "lora_name": "l", "lora_path": "/p"}
    direct = httpx.post(a.url + path, json=body)
    assert direct.status_code == 400 and direct.json()["error"]["param"] == "model"
    headers = {"authorization": "Bearer admin-key"}
    routed = httpx.post(lm.url + path, json=body, headers=headers)
    assert routed.status_code == 400, routed.text


FAILOVER = [
    ("/v1/embeddings", {"model": MODEL, "input": "x"}, False),
    ("/v1/rerank", {"model": MODEL, "query": "q", "documents": ["a"]}, False),
    ("/classify", {"model": MODEL, "input": "x"}, False),
    ("/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": 2}, False),
    ("/v1/responses", {"model": MODEL, "input": "x", "max_output_tokens": 2, "stream": True},
     True),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2,
                      "messages": [{"role": "user", "content": "x"}]}, False),
    ("/v1/messages", {"model": MODEL, "max_tokens": 2, "stream": True,
                      "messages": [{"role": "user", "content": "x"}]}, True),
]


def test_failover_before_the_first_byte_on_every_route(start_servers) -> None:
    a, b = start_servers(replica()), start_servers(replica())
    lm = start_servers(router([a.url, b.url], "--policy", "round_robin", "--eject-after", "100",
                              "--expose-replica-header"))
    httpx.post(a.url + "/_emulator/faults", json={"http_status": 500})
    for path, body, stream in FAILOVER:
        for _ in range(2):  # round robin: one of the two tries a first
            r = httpx.post(lm.url + path, json=body)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["x-lmroute-replica"] == b.url
            assert r.headers["content-type"].startswith(
                "text/event-stream" if stream else "application/json")
    for stream in ("false", "true"):  # the upload is replayed to b from what a was sent
        for _ in range(2):
            r = httpx.post(lm.url + "/v1/audio/transcriptions",
                           data={"model": MODEL, "stream": stream},
                           files={"file": ("a.wav", AUDIO)})
            assert r.status_code == 200, r.text
            assert r.headers["x-lmroute-replica"] == b.url
    a.kill()  # connect errors: the same
    r = httpx.post(lm.url + "/v1/audio/translations", data={"model": MODEL},
                   files={"file": ("a.wav", AUDIO)})
    assert r.status_code == 200


def test_sleep_and_wake_reach_every_replica(fleet) -> None:
    a, b, lm = fleet
    assert httpx.post(lm.url + "/sleep").status_code == 401
    slept = httpx.post(lm.url + "/sleep?level=1", headers=ADMIN)
    assert slept.status_code == 200
    assert {d["replica"]: d["status"] for d in slept.json()["data"]} == {a.url: 200, b.url: 200}
    asleep = httpx.get(lm.url + "/is_sleeping", headers=ADMIN).json()
    assert [d["body"] for d in asleep["data"]] == [{"is_sleeping": True}] * 2
    assert httpx.post(lm.url + "/wake_up", headers=ADMIN).json()["ok"] is True
    assert httpx.post(lm.url + "/reset_prefix_cache", headers=ADMIN).json()["ok"] is True
    awake = httpx.get(lm.url + "/is_sleeping", headers=ADMIN).json()
    assert [d["body"] for d in awake["data"]] == [{"is_sleeping": False}] * 2


def test_routers_sharing_a_redis_index_share_response_ids(start_servers, redis_url: str) -> None:
    a, b = start_servers(replica()), start_servers(replica())
    opts = ("--policy", "round_robin", "--expose-replica-header", "--index", redis_url)
    first = start_servers(router([a.url, b.url], *opts))
    second = start_servers(router([a.url, b.url], *opts))
    raw = _client(first).responses.with_raw_response.create(model=MODEL, input="shared",
                                                            max_output_tokens=2)
    created = raw.parse()
    stored = redis.Redis.from_url(redis_url).get("lmroute:response:" + created.id)
    assert stored == raw.headers["x-lmroute-replica"].encode()
    for _ in range(3):  # the other router reads the holder from Redis
        got = _client(second).responses.with_raw_response.retrieve(created.id)
        assert got.headers["x-lmroute-replica"] == raw.headers["x-lmroute-replica"]


def test_unknown_response_id_is_404(fleet) -> None:
    _, _, lm = fleet
    with pytest.raises(openai.NotFoundError) as err:
        _client(lm).responses.retrieve("resp_unknown")
    assert err.value.body["message"] == "Response with id 'resp_unknown' not found."


def test_upload_over_the_limit_is_413(start_servers) -> None:
    a = start_servers(replica())
    lm = start_servers(router([a.url], "--max-body-bytes", "4096"))
    r = httpx.post(lm.url + "/v1/audio/transcriptions", data={"model": MODEL},
                   files={"file": ("a.wav", AUDIO)})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"
