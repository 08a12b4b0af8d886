"""``alternating``: each successive request of a session goes to the next replica.

The study's cross-replica pattern: turn k of a session runs on replica (start + k) mod N,
so every turn after the first finds its history on another replica's GPU — a full
recompute without a shared pool, a pool load with one. The first turn starts at the
session's rendezvous choice. The last replica per session is remembered in ``dispatched``
(an LRU bounded by ``max_sessions``, so memory stays flat under endless new sessions).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

from policies.base import BasePolicy, Decision, ReplicaView, RequestView
from policies.hashing import rendezvous_rank


class Alternating(BasePolicy):
    name: ClassVar[str] = "alternating"

    def __init__(self, max_sessions: int = 100_000) -> None:
        self._last: OrderedDict[str, str] = OrderedDict()
        self._max_sessions = max_sessions

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = self.candidates(request, replicas)
        last = self._last.get(request.session)
        if last is None:
            return Decision(rendezvous_rank(request.session, candidates)[0].id, "first-turn")
        order = [r.id for r in replicas]
        allowed = {r.id for r in candidates}
        start = order.index(last) if last in order else -1
        for step in range(1, len(order) + 1):
            rid = order[(start + step) % len(order)]
            if rid in allowed:
                return Decision(rid, "alternate")
        raise AssertionError("candidates() guarantees one allowed replica")

    def dispatched(self, request: RequestView, decision: Decision) -> None:
        self._last[request.session] = decision.replica
        self._last.move_to_end(request.session)
        while len(self._last) > self._max_sessions:
            self._last.popitem(last=False)
