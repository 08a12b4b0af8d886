"""Where each replica's KV events come from: the ``--kv-events`` / ``--kv-events-replay``
settings parsed into one ``EventSource`` per engine publisher.

Each setting is a list aligned with ``--backend`` (positional) or of ``BACKEND_URL=ENDPOINTS``
pairs. ``ENDPOINTS`` is one publisher, or several for a data-parallel engine (vLLM runs
one engine core per DP rank, each with its own publisher, sequence numbers and replay
buffer; vLLM offsets the configured port by the rank, so ranks sit on consecutive ports):

- ``tcp://h:5557+tcp://h:5558``: ranks joined with ``+``, rank 0 first;
- ``tcp://h:5557..5560``: a port range, inclusive (four ranks here; at most 256);
- ``bind:`` before an endpoint makes the router bind it (the engine connects).

A replica's replay endpoints, when given, must name as many publishers as its event
endpoints; rank ``i`` replays from the ``i``-th.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import ReplicaId

MAX_RANKS = 256
_RANGE = re.compile(r"(?P<head>.*:)(?P<lo>\d+)\.\.(?P<hi>\d+)")


@dataclass(frozen=True, slots=True)
class EventSource:
    """One engine publisher: ``rank`` is its position among its replica's endpoints."""

    replica: ReplicaId
    endpoint: str
    bind: bool = False
    replay: str | None = None
    rank: int = 0


def _split(entry: str) -> tuple[str | None, str]:
    """``URL=tcp://...`` -> (URL, endpoints); bare endpoints -> (None, endpoints)."""
    head, sep, tail = entry.rpartition("=")
    return (head.rstrip("/"), tail) if sep else (None, entry)


def expand(endpoints: str) -> list[str]:
    """``a+b`` and ``tcp://h:5557..5560`` -> one endpoint per rank."""
    out: list[str] = []
    for part in endpoints.split("+"):
        found = _RANGE.fullmatch(part)
        if found is None:
            out.append(part)
            continue
        lo, hi = int(found["lo"]), int(found["hi"])
        if hi < lo or hi - lo >= MAX_RANKS:
            raise ValueError(f"port range {part!r}: need LOW..HIGH, at most {MAX_RANKS} ports")
        out.extend(f"{found['head']}{port}" for port in range(lo, hi + 1))
    if not all(out):
        raise ValueError(f"empty endpoint in {endpoints!r}")
    return out


def _align(backends: Sequence[str], entries: Sequence[str], what: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    bare = [e for e in entries if _split(e)[0] is None]
    if bare and len(bare) != len(entries):
        raise ValueError(f"--{what}: use either positional endpoints or URL=endpoint pairs")
    if bare and len(bare) != len(backends):
        raise ValueError(f"--{what}: {len(bare)} endpoints for {len(backends)} backends")
    ids = [b.rstrip("/") for b in backends]
    for i, entry in enumerate(entries):
        url, endpoints = _split(entry)
        url = url if url is not None else ids[i]
        if url not in ids:
            raise ValueError(f"--{what}: {url!r} is not a --backend")
        out[url] = expand(endpoints)
    return out


def parse_sources(backends: Sequence[str], kv_events: Sequence[str],
                  replay: Sequence[str] = ()) -> list[EventSource]:
    """The ``--kv-events`` / ``--kv-events-replay`` settings: one source per publisher."""
    events = _align(backends, kv_events, "kv-events")
    replays = _align(backends, replay, "kv-events-replay")
    sources = []
    for replica, endpoints in events.items():
        replay_of: list[str | None] = list(replays.get(replica, [None] * len(endpoints)))
        if len(replay_of) != len(endpoints):
            raise ValueError(f"--kv-events-replay: {len(replay_of)} replay endpoints for "
                             f"{len(endpoints)} event endpoints of {replica}")
        for rank, (endpoint, again) in enumerate(zip(endpoints, replay_of, strict=True)):
            bind = endpoint.startswith("bind:")
            sources.append(EventSource(replica, endpoint.removeprefix("bind:"), bind,
                                       again, rank))
    return sources
