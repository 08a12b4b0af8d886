"""Drive chat sessions through an OpenAI endpoint and time them: the demo's, live's and A/B's.

- ``chat_turn`` streams one chat completion and measures, in model seconds (wall seconds /
  ``time_scale``): TTFT = request sent to the first non-empty content chunk, and the whole
  turn. It also reads the router's ``x-lmroute-replica`` / ``-reason`` / ``-arm`` headers
  and the replica's usage (prompt and cached tokens).
- ``run_session`` is the one session loop: it waits for the session's arrival, sends its
  turns one after another (each turn's messages built from the previous turn's messages
  and reply by the ``SessionScript``), sleeps the script's think time between turns, and
  returns one ``TurnResult`` per turn sent. With ``errors="record"`` a failed turn is
  recorded with its error and ends the session; with ``"raise"`` it propagates.
- ``text_of`` makes session text: hex of seeded random bytes, ASCII, so the emulated
  tokenizer counts 4 characters a token. ``log_uniform_tokens`` draws a session's start
  size, log-uniform in [lo, hi] (many short starts, a few long documents).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import orjson

from sim.emulator.tokens import BYTES_PER_TOKEN

MODEL = "emulated-27b"
Messages = list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class TurnTiming:
    """What one streamed turn measured (model seconds) and where the router sent it."""

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


def log_uniform_tokens(rng: random.Random, lo: float, hi: float) -> float:
    """A size drawn log-uniformly in [``lo``, ``hi``]; callers round it as their design says."""
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


async def chat_turn(client: httpx.AsyncClient, url: str, session: str, messages: Messages, *,
                    output_tokens: int, time_scale: float,
                    model: str = MODEL) -> tuple[TurnTiming, str]:
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
    turn = TurnTiming(((first or end) - sent) / time_scale, (end - sent) / time_scale, replica,
                      int(usage.get("prompt_tokens", 0)), cached, reason, arm)
    return turn, "".join(pieces)


@dataclass(frozen=True, slots=True)
class SessionScript:
    """What one session sends: its key, first messages, how each later turn's messages
    follow from the previous ones and their reply (``follow(k, history, reply)``), each
    turn's reply length, the think time after each turn, and its arrival (model seconds
    after the start ``t0`` given to ``run_session``)."""

    key: str
    turns: int
    first: Messages
    follow: Callable[[int, Messages, str], Messages]
    output_tokens: Callable[[int], int]
    thinks_s: Sequence[float] = ()
    arrival_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One turn sent: its index, when it was sent (model seconds after ``t0``), and its
    timing or the error that ended the session."""

    turn: int
    sent_s: float
    timing: TurnTiming | None
    error: str | None = None


async def run_session(client: httpx.AsyncClient, url: str, script: SessionScript, *,
                      time_scale: float, model: str = MODEL, t0: float | None = None,
                      on_turn: Callable[[], None] = lambda: None,
                      errors: Literal["record", "raise"] = "record") -> list[TurnResult]:
    """Send the script's turns (see the module docstring)."""
    start = time.perf_counter() if t0 is None else t0
    await asyncio.sleep(max(0.0, start + script.arrival_s * time_scale - time.perf_counter()))
    messages, reply = script.first, ""
    out: list[TurnResult] = []
    for k in range(script.turns):
        if k:
            messages = script.follow(k, messages, reply)
        sent = (time.perf_counter() - start) / time_scale
        try:
            timing, reply = await chat_turn(client, url, script.key, messages,
                                            output_tokens=script.output_tokens(k),
                                            time_scale=time_scale, model=model)
        except (httpx.HTTPError, RuntimeError) as exc:
            if errors == "raise":
                raise
            out.append(TurnResult(k, sent, None, str(exc) or type(exc).__name__))
            on_turn()
            break
        out.append(TurnResult(k, sent, timing))
        on_turn()
        if k < len(script.thinks_s) and k + 1 < script.turns:
            await asyncio.sleep(script.thinks_s[k] * time_scale)
    return out
