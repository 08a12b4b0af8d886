"""The engine's own count of a reply's prompt and cached tokens, read off the reply's tail.

vLLM ends a reply's ``usage`` with ``prompt_tokens`` and, when started with
``--enable-prompt-tokens-details``, ``prompt_tokens_details.cached_tokens``: the tokens it
did not compute, prefix-cache hits and tokens a KV connector (LMCache) loaded together
(``num_computed_tokens`` when first scheduled, vllm/v1/core/sched/scheduler.py). A
non-streamed reply carries ``usage`` at its end; a streamed one only when the client asked
(``stream_options.include_usage``), in the last event before ``data: [DONE]``.

``engine_usage(tail)`` finds the last ``"prompt_tokens": N`` and ``"cached_tokens": M``
in the reply's last bytes with one regular-expression scan each, without parsing the
JSON: the router relays replies as bytes and this runs once per reply. A key inside a
generated string is escaped (``\\"cached_tokens\\"``) and never matches. Returns
``(prompt_tokens, cached_tokens)``, or ``None`` when either is missing (no usage, or no
details: ``cached_tokens`` null).
"""

from __future__ import annotations

import re

TAIL_BYTES = 2048  # usage is the last object of a reply; its keys fit well within this

_PROMPT = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')


def engine_usage(tail: bytes) -> tuple[int, int] | None:
    """``(prompt_tokens, cached_tokens)`` from the last ``TAIL_BYTES`` of a reply."""
    tail = tail[-TAIL_BYTES:]
    cached = _last(_CACHED, tail)
    if cached is None:
        return None
    prompt = _last(_PROMPT, tail)
    if prompt is None or cached > prompt:
        return None
    return prompt, cached


def _last(pattern: re.Pattern[bytes], data: bytes) -> int | None:
    found = pattern.findall(data)
    return int(found[-1]) if found else None
