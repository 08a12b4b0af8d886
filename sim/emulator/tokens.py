"""The emulated replica's tokenizer, chat template and reply generator (deterministic).

Tokenizer: the prompt's UTF-8 bytes cut into 4-byte pieces, each piece's id =
xxh32(piece) mod ``VOCAB`` — about the 4 characters per token of real BPE tokenizers on
English, with no vocabulary file. Chat template: ``<|role|>\\n{text}\\n`` per message, then
``<|assistant|>\\n``. Two replicas tokenize one prompt identically, so prefix blocks
match across replicas as they do for vLLM with the same model.

Replies are a pure function of the prompt token ids (and a ``salt`` that is non-zero only
when a pool load was corrupt): words drawn from a fixed list by a generator seeded with
xxh3-64 of the ids. Identical prompts get identical replies on every replica, the
property a shared-cache validation tool checks.
"""

from __future__ import annotations

import random
from typing import Any

import xxhash

from router.prefix import pack_token_ids

VOCAB = 32_000
BYTES_PER_TOKEN = 4
_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "it", "for", "as", "with", "was", "on",
    "be", "by", "at", "this", "from", "are", "or", "an", "which", "cache", "prefix",
    "replica", "pool", "token", "block", "route", "session", "load", "prefill", "decode",
    "latency",
)


def tokenize_text(text: str) -> list[int]:
    data = text.encode("utf-8")
    return [
        xxhash.xxh32_intdigest(data[i : i + BYTES_PER_TOKEN]) % VOCAB
        for i in range(0, len(data), BYTES_PER_TOKEN)
    ]


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    return "".join(
        str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
    )


def render_chat(messages: list[dict[str, Any]]) -> str:
    """The emulator's chat template."""
    parts = [f"<|{m.get('role')}|>\n{_content_text(m.get('content'))}\n"
             for m in messages if isinstance(m, dict)]
    parts.append("<|assistant|>\n")
    return "".join(parts)


def prompt_token_ids(endpoint: str, body: dict[str, Any]) -> list[int]:
    """Token ids of a chat or completions body (token-id prompts pass through; a
    ``prompt_embeds``-only prompt reads as the text of its base64)."""
    if endpoint == "chat":
        return tokenize_text(render_chat(body["messages"]))
    prompt = body.get("prompt")
    if prompt is None:
        embeds = body.get("prompt_embeds")
        return tokenize_text(embeds if isinstance(embeds, str) else "".join(map(str, embeds or [])))
    if isinstance(prompt, str):
        return tokenize_text(prompt)
    if prompt and isinstance(prompt[0], int):
        return [int(t) for t in prompt]
    if prompt and isinstance(prompt[0], list):
        return [int(t) for t in prompt[0]]
    return tokenize_text("".join(prompt[:1]))


def reply_words(token_ids: list[int], n: int, salt: int = 0) -> list[str]:
    """``n`` reply pieces, a pure function of the prompt ids and ``salt``."""
    seed = xxhash.xxh3_64_intdigest(pack_token_ids(token_ids), seed=salt)
    rng = random.Random(seed)
    return [(" " if i else "") + rng.choice(_WORDS) for i in range(n)]
