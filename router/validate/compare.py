"""One reply against its cold reference, and a tier's verdict over its prompts.

Both replies are greedy (temperature 0, fixed seed) with ``top_logprobs >= 2``. Walking
the output positions ``i`` in order:

- same token: ``|lp_ref(i) - lp(i)|`` is the logprob divergence; over ``tol`` it is a
  mismatch (``first_logprob_diff = i``), however the tokens go on;
- different token: if the reference's own top-2 margin at ``i`` is at most ``2 * tol``,
  the two candidates were a near tie within numeric noise, so a healthy engine may pick
  either: the comparison stops there (``near_tie = i``) and the prompt still passes;
  otherwise it is a token mismatch (``first_token_diff = i``) and the walk stops (after a
  real flip the continuations differ by construction).

A reply shorter than its reference (an early EOS) differs at its length unless the
reference also ended there. ``tol`` comes from a healthy engine (docs/validate.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Reply:
    """What one completion returned, per output position."""

    tokens: list[str]
    logprobs: list[float]
    margins: list[float | None]  # chosen minus runner-up logprob (None: no runner-up given)
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens, if reported
    prompt_tokens: int


class BadReply(ValueError):
    """A reply without usable logprobs."""


def _positions(lp: dict[str, Any]) -> list[tuple[str, float, list[float]]]:
    """(token, logprob, alternatives' logprobs) per position, chat or completions shape."""
    if "content" in lp:  # chat: [{"token", "logprob", "top_logprobs": [{...}]}]
        return [(str(p["token"]), float(p["logprob"]),
                 [float(t["logprob"]) for t in p.get("top_logprobs") or []])
                for p in lp["content"] or []]
    return [(str(t), float(x), [float(v) for v in (tops or {}).values()])
            for t, x, tops in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                  strict=True)]


def parse_reply(data: Any) -> Reply:
    """A chat or completions reply with logprobs as a ``Reply``; ``BadReply`` when malformed."""
    try:
        positions = _positions(data["choices"][0]["logprobs"])
        margins: list[float | None] = []
        for _, chosen, alts in positions:
            others = sorted(alts, reverse=True)
            margins.append(max(chosen, others[0]) - others[1] if len(others) > 1 else None)
        usage = data.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return Reply([p[0] for p in positions], [p[1] for p in positions], margins,
                     None if cached is None else int(cached), int(usage.get("prompt_tokens", 0)))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BadReply(f"a completion without usable logprobs: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class Comparison:
    """One prompt of one tier against its cold reference."""

    ok: bool
    first_token_diff: int | None
    first_logprob_diff: int | None
    max_dlogprob: float  # largest |delta logprob| over the positions compared
    near_tie: int | None
    compared: int  # positions compared
    cached_tokens: int | None

    @property
    def first_diff(self) -> int | None:
        found = [p for p in (self.first_token_diff, self.first_logprob_diff) if p is not None]
        return min(found) if found else None


def compare(ref: Reply, got: Reply, tol: float) -> Comparison:
    """``got`` against ``ref`` (see the module docstring)."""
    first_tok: int | None = None
    first_lp: int | None = None
    tie: int | None = None
    worst = 0.0
    n = min(len(ref.tokens), len(got.tokens))
    i = 0
    for i in range(n):
        if ref.tokens[i] != got.tokens[i]:
            margin = ref.margins[i]
            if margin is not None and margin <= 2 * tol:
                tie = i
            else:
                first_tok = i
            break
        delta = abs(ref.logprobs[i] - got.logprobs[i])
        worst = max(worst, delta)
        if delta > tol and first_lp is None:
            first_lp = i
    else:
        i = n
        if len(ref.tokens) != len(got.tokens):
            first_tok = n
    return Comparison(ok=first_tok is None and first_lp is None, first_token_diff=first_tok,
                      first_logprob_diff=first_lp, max_dlogprob=worst, near_tie=tie,
                      compared=i, cached_tokens=got.cached_tokens)


@dataclass(slots=True)
class TierResult:
    """A tier over every prompt: match rate, first differing position, verdict."""

    tier: str
    expect_cached: bool  # a cache tier: its prompts should report cached tokens
    comparisons: list[Comparison] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # prompt tokens, per comparison
    skipped: str | None = None  # why the tier did not run

    @property
    def matched(self) -> int:
        return sum(c.ok for c in self.comparisons)

    @property
    def match_rate(self) -> float | None:
        return self.matched / len(self.comparisons) if self.comparisons else None

    @property
    def first_diff(self) -> int | None:
        found = [c.first_diff for c in self.comparisons if c.first_diff is not None]
        return min(found) if found else None

    @property
    def first_token_diff(self) -> int | None:
        return _least(c.first_token_diff for c in self.comparisons)

    @property
    def first_logprob_diff(self) -> int | None:
        return _least(c.first_logprob_diff for c in self.comparisons)

    @property
    def failing_lengths(self) -> list[int]:
        """Prompt lengths with at least one failing prompt (a fault past a position)."""
        return sorted({n for n, c in zip(self.lengths, self.comparisons, strict=True)
                       if not c.ok})

    @property
    def max_dlogprob(self) -> float:
        return max((c.max_dlogprob for c in self.comparisons), default=0.0)

    @property
    def cache_hits(self) -> int | None:
        """Prompts that reported cached tokens (None: the engine reports none at all)."""
        known = [c.cached_tokens for c in self.comparisons if c.cached_tokens is not None]
        return sum(1 for c in known if c > 0) if known else None

    @property
    def verdict(self) -> str:
        """``pass``; ``FAIL``; ``not exercised`` (a cache tier no prompt hit); ``not cold``
        (a fresh-salt tier that reported cached tokens: the engine ignores ``cache_salt``,
        so the reference is not a reference); ``skipped``."""
        if self.skipped is not None or not self.comparisons:
            return "skipped"
        if self.matched < len(self.comparisons):
            return "FAIL"
        if self.expect_cached and self.cache_hits == 0:
            return "not exercised"
        if not self.expect_cached and self.cache_hits:
            return "not cold"
        return "pass"


def _least(values: Iterable[int | None]) -> int | None:
    found = [v for v in values if v is not None]
    return min(found) if found else None
