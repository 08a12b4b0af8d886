"""The last placements ``locality`` made away from the prefix's holder, and what they cost.

A request sent to a replica that holds less of its prompt than another candidate (reason
``balance``) recomputes, or loads, what the other holds: a copy. Copies are what the
vLLM pair's prefix-cache hit rate loses to the affinity rules, and they are rare (a few
a run), so a summary cannot say why each was made. This keeps the last ``size`` of them
with what the decision saw, for ``GET /policy``: when (``at``, the request's clock),
each candidate's predicted wait, service and score, its cached tokens and our requests
queued on it, the model's running error, its bound, its error behind our queue and
calibration's term factors; and, once its first token comes, the copy's own time to
first token (``ttft_s``; for a reply not streamed, its whole time, as ``Outcome``
reports it), beside which the holder's queue can be read.

Cost: a copy keeps references to what the decision saw (its estimates and scores, fresh
per decision and never changed after) and two small snapshots (our queues, the factors);
the JSON is built only when asked for (``as_json``): copies of one opening, sent by many
clients at once, can be most of a burst's decisions. One ``in`` test per first token
while a copy waits for its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from policies.cost import Estimate


@dataclass(slots=True)
class _Copy:
    """One copy as its decision saw it (``CopyLog.add``'s arguments), and its first token."""

    request: str
    at: float
    chosen: str
    estimates: dict[str, Estimate]
    scores: dict[str, float]
    pending: dict[str, int]
    error: float
    error_bound: float
    queued_error: float
    factors: dict[str, float]
    ttft_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3), "request": self.request, "chosen": self.chosen,
            "error": round(self.error, 4), "error_bound": round(self.error_bound, 4),
            "queued_error": round(self.queued_error, 4),
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
            "factors": {k: round(v, 4) for k, v in self.factors.items()},
            "candidates": {rid: {"wait_s": round(e.wait_s, 4),
                                 "service_s": round(e.load_s + e.prefill_s, 4),
                                 "score": round(self.scores.get(rid, 0.0), 4),
                                 "cached_tokens": e.gpu_tokens + e.pool_tokens,
                                 "queued": self.pending.get(rid, 0)}
                           for rid, e in self.estimates.items()},
        }


class CopyLog:
    """``size``: how many copies are kept (the oldest go first)."""

    def __init__(self, size: int = 16) -> None:
        self._entries: deque[_Copy] = deque(maxlen=size)
        self._waiting: dict[str, _Copy] = {}  # request id -> its entry, until observed

    def add(self, request_id: str, at: float, chosen: str, estimates: dict[str, Estimate],
            scores: dict[str, float], pending: dict[str, int], error: float,
            error_bound: float, queued_error: float = 0.0,
            factors: dict[str, float] | None = None) -> None:
        """Log one copy: ``estimates``/``scores``/``pending`` per candidate, as ``choose``
        saw them; ``queued_error``: ``Locality.queued_error``, the running error of
        predictions behind our queue; ``factors``: calibration's term factors then (a
        queued request's service is predicted with its own fixed factor, an unqueued
        one's with the other)."""
        entry = _Copy(request_id, at, chosen, estimates, scores, pending, error, error_bound,
                      queued_error, factors or {})
        if len(self._entries) == self._entries.maxlen:  # the oldest leaves: stop waiting on it
            self._waiting.pop(self._entries[0].request, None)
        self._entries.append(entry)
        self._waiting[request_id] = entry

    def observed(self, request_id: str, ttft_s: float | None) -> None:
        """A first token (or a failure: ``None``) of ``request_id``, if it is a logged copy."""
        if self._waiting:
            entry = self._waiting.pop(request_id, None)
            if entry is not None:
                entry.ttft_s = ttft_s

    def as_json(self) -> list[dict[str, Any]]:
        return [entry.as_json() for entry in self._entries]
