"""``least_loaded``: the replica with the fewest requests in flight plus waiting.

Load = the router's own in-flight count (exact, instant) + the engine's scraped
``vllm:num_requests_waiting`` (sees traffic from other routers). Ties, common at low
load, rotate with a cursor so an idle deployment is not served by one replica alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from policies.base import BasePolicy, Decision, ReplicaView, RequestView


class LeastLoaded(BasePolicy):
    name: ClassVar[str] = "least_loaded"

    def __init__(self) -> None:
        self._cursor = 0

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = self.candidates(request, replicas)
        n = len(candidates)
        start = self._cursor % n
        rotated = candidates[start:] + candidates[:start]
        best = min(rotated, key=lambda r: r.load)
        return Decision(best.id, "least-loaded")

    def dispatched(self, request: RequestView, decision: Decision) -> None:
        self._cursor += 1
