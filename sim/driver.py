"""Drive chat turns through an OpenAI endpoint and time them (demo, live load, A/B).

``chat_turn`` streams one chat completion and measures, in model seconds (wall seconds /
``time_scale``): TTFT = request sent to the first non-empty content chunk, and the whole
turn. It also reads the router's ``x-lmroute-replica`` / ``-reason`` / ``-arm`` headers and
the replica's usage (prompt and cached tokens). ``text_of`` makes session text: hex of
seeded random bytes, ASCII, so the emulated tokenizer counts 4 characters a token.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from sim.tokens import BYTES_PER_TOKEN

MODEL = "emulated-27b"


@dataclass(frozen=True, slots=True)
class Turn:
    ttft_s: float
    total_s: float
    replica: str
    prompt_tokens: int
    cached_tokens: int
    reason: str = ""
    arm: str = ""


def text_of(seed: int, tokens: int) -> str:
    """``tokens`` emulated tokens of text, a pure function of ``seed``."""
    return random.Random(seed).randbytes(tokens * BYTES_PER_TOKEN // 2).hex()


async def chat_turn(client: httpx.AsyncClient, url: str, session: str,
                    messages: list[dict[str, str]], *, output_tokens: int,
                    time_scale: float, model: str = MODEL) -> tuple[Turn, str]:
    """One streamed turn; returns its timing and the reply text."""
    body = {"model": model, "messages": messages, "max_tokens": output_tokens,
            "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", url + "/v1/chat/completions", content=orjson.dumps(body),
                             headers={"x-session-id": session,
                                      "content-type": "application/json"}) as resp:
        resp.raise_for_status()
        replica = resp.headers.get("x-lmroute-replica", "")
        reason = resp.headers.get("x-lmroute-reason", "")
        arm = resp.headers.get("x-lmroute-arm", "")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream broke: {chunk['error']}")
            for choice in chunk.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    first = first if first is not None else time.perf_counter()
                    pieces.append(content)
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    turn = Turn(((first or end) - sent) / time_scale, (end - sent) / time_scale, replica,
                int(usage.get("prompt_tokens", 0)), cached, reason, arm)
    return turn, "".join(pieces)
