"""The emulated replica's reply tokens and logprobs, healthy or corrupt (deterministic).

Tokens are ``sim.emulator.tokens.reply_words`` of the prompt ids. Logprobs come from a
second generator seeded with xxh3-64 of the ids (seed 7): at output position ``i`` the
chosen token's logprob ``lp_i`` is uniform in [-2.5, -0.01] and the runner-up's is
``lp_i - m_i`` with the margin ``m_i`` uniform in [0.05, 3.0]; further alternatives step
down by 0.5.

Healthy jitter. A real engine's kernels differ in the last bits with and without a
cached prefix (bf16/FP8 attention over a different split of the sequence), so a reply
whose prefix came from a cache gets each logprob moved by a deterministic
``±CACHED_JITTER`` (2e-3 nats). The smallest margin (0.05) is far above it: the greedy
tokens never flip on a healthy replica, only the last bits of the logprobs move.

Corruption (``corrupt=True``, sim.emulator.corruption). Every logprob moves down by
``CORRUPT_SHIFT`` (0.3 nats, 150x the jitter) from the first position, and the tokens
keep the true ones for ``d = seed mod 8`` positions, then take the runner-up at ``d`` and
the words of a different generator after it: a small error in loaded KV keeps the argmax
for a few steps before it flips, as the study's byte tests saw replies drift.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import xxhash

from router.prefix import pack_token_ids
from sim.emulator.tokens import _WORDS, reply_words

CACHED_JITTER = 2e-3
CORRUPT_SHIFT = 0.3
MAX_HEALTHY_DIVERGENCE = 8  # corrupt tokens differ from position seed % 8


@dataclass(frozen=True, slots=True)
class Reply:
    """Output pieces and, per position, ``(piece, logprob)`` alternatives best first."""

    words: list[str]
    tops: list[list[tuple[str, float]]]


def reply(ids: list[int], n: int, *, corrupt: bool = False, cached: bool = False) -> Reply:
    """The reply to prompt ``ids`` (see the module docstring)."""
    data = pack_token_ids(ids)
    seed = xxhash.xxh3_64_intdigest(data)
    rng = random.Random(xxhash.xxh3_64_intdigest(data, seed=7))
    words = reply_words(ids, n)
    tops: list[list[tuple[str, float]]] = []
    for i, word in enumerate(words):
        lp, margin = -rng.uniform(0.01, 2.5), rng.uniform(0.05, 3.0)
        if cached or corrupt:
            unit = xxhash.xxh32_intdigest(data, seed=i) / 0xFFFFFFFF
            lp += (2 * unit - 1) * CACHED_JITTER
        if corrupt:
            lp -= CORRUPT_SHIFT
        others = [w for w in _WORDS if w.strip() != word.strip()]
        alts = [(" " if i else "") + others[(seed + i + k) % len(others)] for k in range(4)]
        tops.append([(word, lp)] + [(a, lp - margin - 0.5 * k) for k, a in enumerate(alts)])
    if corrupt and n:
        d = min(seed % MAX_HEALTHY_DIVERGENCE, n - 1)
        wrong = reply_words(ids, n, salt=1)
        words = [*words[:d], tops[d][1][0], *wrong[d + 1 :]]
        tops = tops[:d] + [[(words[j], tops[j][0][1]), *tops[j][1:]] for j in range(d, n)]
    return Reply(words, tops)


def _bytes(piece: str) -> list[int]:
    return list(piece.encode())


def chat_logprobs(r: Reply, top: int) -> dict[str, Any]:
    """vLLM's chat ``logprobs`` object (``top`` alternatives per position)."""
    return {"content": [{
        "token": alts[0][0], "logprob": alts[0][1], "bytes": _bytes(alts[0][0]),
        "top_logprobs": [{"token": w, "logprob": lp, "bytes": _bytes(w)}
                         for w, lp in alts[:top]]} for alts in r.tops]}


def completion_logprobs(r: Reply, top: int) -> dict[str, Any]:
    """vLLM's completions ``logprobs`` object (``top`` alternatives per position)."""
    offsets, at = [], 0
    for w in r.words:
        offsets.append(at)
        at += len(w)
    return {"tokens": list(r.words), "token_logprobs": [a[0][1] for a in r.tops],
            "top_logprobs": [dict(a[: max(1, top)]) for a in r.tops], "text_offset": offsets}


def requested_logprobs(endpoint: str, body: dict[str, Any]) -> int | None:
    """How many alternatives the body asks for (None: no logprobs)."""
    if endpoint == "chat":
        if not body.get("logprobs"):
            return None
        top = body.get("top_logprobs")
        return int(top) if isinstance(top, int) and not isinstance(top, bool) else 0
    lp = body.get("logprobs")
    return int(lp) if isinstance(lp, int) and not isinstance(lp, bool) else None
