"""``round_robin``: each request goes to the next healthy replica in turn.

The cursor advances in ``dispatched``, so ``choose`` stays pure; failover retries skip the
replicas already tried for the request. Locality-blind: the baseline every peer ships.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from policies.base import BasePolicy, Decision, ReplicaView, RequestView


class RoundRobin(BasePolicy):
    name: ClassVar[str] = "round_robin"

    def __init__(self) -> None:
        self._cursor = 0

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = self.candidates(request, replicas)
        return Decision(candidates[self._cursor % len(candidates)].id, "round-robin")

    def dispatched(self, request: RequestView, decision: Decision) -> None:
        self._cursor += 1
