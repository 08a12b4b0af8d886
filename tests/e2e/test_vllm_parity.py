"""Token parity: the router's chat token ids equal real vLLM's, chat by chat.

Every body of the generated corpus (``parity_corpus.cases``: plain, multi-turn, tool
calls and results, content parts, long, add_generation_prompt false,
continue_final_message, chat_template_kwargs, developer messages) goes to one vLLM
replica's ``/tokenize`` (chat form) and to the router's ``ChatTokenizer`` built from the
same model directory. A case matches when the ids are equal, or when both refuse the body
(vLLM answers 400, the router raises TemplateFailed and routes without locality).
Explained exceptions (``VLLM_REJECTS``): bodies vLLM's request validation refuses (400)
that the router still renders; no request is served for them, so no chain can diverge.
The match rate and every miss go to $LMROUTE_E2E_REPORT under ``token_parity``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from parity_corpus import REFUSED, VLLM_REJECTS, cases
from vllm_servers import VllmServer

from router.tokenizer import ChatTokenizer, TemplateFailed

pytestmark = pytest.mark.vllm


def vllm_ids(url: str, body: dict[str, Any]) -> tuple[list[int] | None, str]:
    """vLLM's ids, or None and its error message when it refuses the body (400)."""
    r = httpx.post(url + "/tokenize", json=body, timeout=120)
    if r.status_code == 400:
        return None, str(r.json().get("error", {}).get("message", r.text))[:300]
    assert r.status_code == 200, r.text
    tokens: list[int] = r.json()["tokens"]
    return tokens, ""


def router_ids(tok: ChatTokenizer, body: dict[str, Any]) -> list[int] | None:
    try:
        return list(tok.ids(body, "chat"))
    except TemplateFailed:
        return None


def first_difference(a: list[int] | None, b: list[int] | None) -> int | None:
    if a is None or b is None:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def report(entry: dict[str, Any]) -> None:
    print("\ntoken parity:", json.dumps(entry))
    if path := os.environ.get("LMROUTE_E2E_REPORT"):
        target = Path(path)
        data = json.loads(target.read_text()) if target.exists() else {}
        target.write_text(json.dumps({**data, "token_parity": entry}, indent=2))


def test_router_tokens_equal_vllms_on_the_corpus(engine: VllmServer, tiny_model: Path) -> None:
    tok = ChatTokenizer.from_dir(tiny_model)
    corpus = cases()
    assert len(corpus) >= 50
    misses, refused, tokens = [], [], 0
    for name, body in corpus:
        (theirs, error), mine = vllm_ids(engine.url, body), router_ids(tok, body)
        if theirs is None:
            refused.append(name)
        tokens += len(theirs or [])
        if mine != theirs:
            misses.append({"case": name, "vllm": error if theirs is None else len(theirs),
                           "router": None if mine is None else len(mine),
                           "first_difference": first_difference(mine, theirs)})
    explained = [m for m in misses if m["case"] in VLLM_REJECTS and m["router"] is not None]
    unexplained = [m for m in misses if m not in explained]
    tokenized = len(corpus) - len(refused)
    differ = [m for m in misses if isinstance(m["vllm"], int)]
    report({"chats": len(corpus), "tokenized_by_vllm": tokenized,
            "equal_ids": tokenized - len(differ), "tokens_compared": tokens,
            "match_rate": round((tokenized - len(differ)) / tokenized, 4),
            "refused_by_both": [r for r in refused if r not in {m["case"] for m in misses}],
            "refused_by_vllm_only": explained, "unexplained": unexplained})
    assert not unexplained, unexplained
    assert sorted(refused) == sorted([*REFUSED, *VLLM_REJECTS])
