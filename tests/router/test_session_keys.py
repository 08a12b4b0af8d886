"""Session keys: which requests the router takes for one conversation.

An explicit key (``X-Session-ID``, else ``user``) always wins. Without one, a chat is keyed
by its system prompt and first user message (later turns keep both); a completions prompt,
which has no structure saying where a conversation starts, is its own session, so prompts
behind one long shared prefix are not glued into one "session" that stickiness would pin
to one replica (the bug vLLM's own benchmark client exposed: 146 of 150 requests on one
engine under ``locality`` and all 150 under ``fixed``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import orjson
from servers import replica, router

from router.openai_api import parse_request

SHARED = "You are a careful assistant for the ACME support desk. " * 60  # ~3.3 KiB


def key(endpoint: Any, body: dict[str, Any], header: str | None = None) -> str:
    return parse_request(endpoint, orjson.dumps(body), header).session


def chat(first_user: str, turns: int = 0) -> dict[str, Any]:
    msgs = [{"role": "system", "content": SHARED}, {"role": "user", "content": first_user}]
    for k in range(turns):
        msgs += [{"role": "assistant", "content": f"answer {k}"},
                 {"role": "user", "content": f"follow-up {k}"}]
    return {"model": "m", "messages": msgs}


def test_completions_behind_a_shared_prefix_are_separate_sessions() -> None:
    keys = {key("completions", {"model": "m", "prompt": SHARED + f"question {i}"})
            for i in range(20)}
    assert len(keys) == 20
    again = key("completions", {"model": "m", "prompt": SHARED + "question 3"})
    assert again in keys  # deterministic


def test_a_chat_keeps_its_key_turn_after_turn_and_differs_by_first_message() -> None:
    assert key("chat", chat("hello", 0)) == key("chat", chat("hello", 3))
    assert key("chat", chat("hello")) != key("chat", chat("good morning"))


def test_an_explicit_key_wins_and_is_scoped_by_the_salt() -> None:
    a = {"model": "m", "prompt": "x"}
    b = {"model": "m", "prompt": "entirely different"}
    assert key("completions", a, "s1") == key("completions", b, "s1")
    assert key("completions", {**a, "user": "u"}) == key("completions", {**b, "user": "u"})
    assert key("completions", a, "s1") != key("completions", {**a, "cache_salt": "t"}, "s1")


def test_fixed_spreads_completions_behind_one_shared_prefix(start_servers) -> None:
    reps = [start_servers(replica()), start_servers(replica())]
    lm = start_servers(router([r.url for r in reps], "--policy", "fixed",
                              "--expose-replica-header"))
    served = Counter()
    for i in range(40):
        r = httpx.post(lm.url + "/v1/completions", timeout=30, json={
            "model": "emulated-27b", "prompt": SHARED + f"question {i}", "max_tokens": 1})
        assert r.status_code == 200, r.text
        served[r.headers["x-lmroute-replica"]] += 1
    # 40 independent sessions by rendezvous hashing: each replica gets some (before the
    # fix all 40 shared one key and one replica).
    assert len(served) == 2 and min(served.values()) >= 8, served
