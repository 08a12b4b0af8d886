"""``fixed``: session-sticky placement by rendezvous hashing over healthy replicas.

The study's "fixed placement": every turn of a session lands on the same replica, whose
GPU prefix cache already holds the history. A lost replica moves only its own sessions
(see ``policies.hashing``); failover retries take the session's next preference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from policies.base import BasePolicy, Decision, ReplicaView, RequestView
from policies.hashing import rendezvous_rank


class Fixed(BasePolicy):
    name: ClassVar[str] = "fixed"

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = self.candidates(request, replicas)
        preferred = rendezvous_rank(request.session, replicas)[0]
        best = rendezvous_rank(request.session, candidates)[0]
        return Decision(best.id, "sticky" if best.id == preferred.id else "failover")
