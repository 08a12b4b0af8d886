"""Model-aware routing: requests go only to replicas serving their model (and LoRA adapters
loaded at run time through the router); an unknown model is vLLM's 404, not a 503."""

from __future__ import annotations

import httpx
import openai
import pytest
from servers import replica, router
from test_failover import _wait

ADMIN = {"authorization": "Bearer admin-key"}


@pytest.fixture
def mixed(start_servers):
    """Replica a serves emulated-27b, b serves other-7b; a round-robin router over both."""
    a = start_servers(replica())
    b = start_servers(replica("--model", "other-7b"))
    lm = start_servers(router([a.url, b.url], "--policy", "round_robin",
                              "--expose-replica-header", "--admin-key", "admin-key",
                              "--models-refresh-s", "0.2"))
    return a, b, lm


def test_requests_reach_only_replicas_serving_their_model(mixed) -> None:
    a, b, lm = mixed
    client = openai.OpenAI(base_url=lm.url + "/v1", api_key="unused")
    for _ in range(4):
        chat = client.chat.completions.with_raw_response.create(
            model="other-7b", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.headers["x-lmroute-replica"] == b.url
        emb = client.embeddings.with_raw_response.create(model="emulated-27b", input="x")
        assert emb.headers["x-lmroute-replica"] == a.url
        done = client.completions.with_raw_response.create(model="other-7b", prompt="p",
                                                           max_tokens=2)
        assert done.headers["x-lmroute-replica"] == b.url
    # A body without a model goes anywhere (vLLM then serves its own model).
    seen = {httpx.post(lm.url + "/v1/embeddings", json={"input": "x"}).headers[
        "x-lmroute-replica"] for _ in range(4)}
    assert seen == {a.url, b.url}
    ids = sorted(m.id for m in client.models.list())
    assert ids == ["emulated-27b", "other-7b"]


def test_unknown_model_is_vllms_404(mixed) -> None:
    _, _, lm = mixed
    client = openai.OpenAI(base_url=lm.url + "/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert err.value.body == {"message": "The model `nope` does not exist.",
                              "type": "NotFoundError", "param": "model", "code": 404}
    for path, body in (("/v1/completions", {"model": "nope", "prompt": "x"}),
                       ("/v1/embeddings", {"model": "nope", "input": "x"}),
                       ("/v1/responses", {"model": "nope", "input": "x"})):
        r = httpx.post(lm.url + path, json=body)
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "NotFoundError"


def test_model_of_an_ejected_replica_is_503_not_404(start_servers) -> None:
    a = start_servers(replica())
    b = start_servers(replica("--model", "other-7b"))
    lm = start_servers(router([a.url, b.url], "--health-interval-s", "0.1"))
    _wait(lambda: httpx.post(lm.url + "/v1/embeddings",
                             json={"model": "other-7b", "input": "x"}).status_code == 200)
    b.kill()
    _wait(lambda: not next(r for r in httpx.get(lm.url + "/replicas").json()["replicas"]
                       if r["url"] == b.url)["healthy"])
    r = httpx.post(lm.url + "/v1/chat/completions",
                   json={"model": "other-7b", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_healthy_replica"


def test_lora_loaded_through_the_router_is_routed_and_listed(mixed) -> None:
    a, b, lm = mixed
    body = {"lora_name": "sql-lora", "lora_path": "/adapters/sql"}
    assert httpx.post(lm.url + "/v1/load_lora_adapter", json=body).status_code == 401
    r = httpx.post(lm.url + "/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert r.status_code == 200
    result = r.json()
    assert result["ok"] is True
    assert {d["replica"]: d["status"] for d in result["data"]} == {a.url: 200, b.url: 200}
    assert result["data"][0]["body"] == "Success: LoRA adapter 'sql-lora' added successfully."
    client = openai.OpenAI(base_url=lm.url + "/v1", api_key="unused")
    listed = {m.id: m.model_extra.get("parent") for m in client.models.list()}
    assert listed["sql-lora"] in ("emulated-27b", "other-7b")
    reply = client.chat.completions.create(model="sql-lora", max_tokens=2,
                                           messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.content
    # Loaded twice: every replica refuses alike, and the router answers that status.
    again = httpx.post(lm.url + "/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert again.status_code == 400
    assert again.json()["ok"] is False
    gone = httpx.post(lm.url + "/v1/unload_lora_adapter", json={"lora_name": "sql-lora"},
                      headers=ADMIN)
    assert gone.status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="sql-lora",
                                       messages=[{"role": "user", "content": "x"}])


def test_adapter_on_one_replica_only_goes_there(mixed) -> None:
    _a, b, lm = mixed
    httpx.post(b.url + "/v1/load_lora_adapter", json={"lora_name": "b-only", "lora_path": "/x"})
    chat = {"model": "b-only", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    _wait(lambda: httpx.post(lm.url + "/v1/chat/completions", json=chat).status_code == 200)
    replies = [httpx.post(lm.url + "/v1/chat/completions", json=chat) for _ in range(4)]
    assert {r.headers["x-lmroute-replica"] for r in replies} == {b.url}
