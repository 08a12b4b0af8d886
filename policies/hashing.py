"""Rendezvous (highest-random-weight) hashing of a session onto replicas.

Each replica scores ``xxh3_64(session NUL replica_id)``; the highest score wins. Losing a
replica moves only the sessions it held, each to its second-highest scorer, and
re-admitting it moves exactly those back: no ring, no virtual nodes, no state.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from policies.base import ReplicaView


def rendezvous_rank(session: str, replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """Replicas ordered by the session's preference, most preferred first."""
    return sorted(
        replicas,
        key=lambda r: xxhash.xxh3_64_intdigest(f"{session}\x00{r.id}".encode()),
        reverse=True,
    )
