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

A template, ``*=ENDPOINTS``, serves every replica the list does not name: the static
``--backend`` ones and those that join at run time (admin API, ``--backends-file``,
``dns+`` names; ``router.membership``). ``{host}`` is the replica URL's host (IPv6 in
brackets), ``{port}`` its port, ``{port+N}`` / ``{port-N}`` that plus or minus N; the
result is then expanded as above: ``*=tcp://{host}:5557..5560`` subscribes to four DP
ranks of every pod behind a headless service, ``*=tcp://{host}:{port+1000}`` to replicas
sharing one host. ``EventConfig.sources_for(url)`` derives a joining replica's sources.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from policies.base import ReplicaId

MAX_RANKS = 256
TEMPLATE = "*"
_RANGE = re.compile(r"(?P<head>.*:)(?P<lo>\d+)\.\.(?P<hi>\d+)")
_FIELD = re.compile(r"\{(?P<name>host|port)(?P<delta>[+-]\d+)?\}")


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


def fill(template: str, url: str) -> str:
    """A template's ``{host}``, ``{port}``, ``{port+N}`` for the replica at ``url``."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = parts.port or (443 if parts.scheme == "https" else 80)

    def one(found: re.Match[str]) -> str:
        if found["name"] == "host":
            if found["delta"]:
                raise ValueError(f"{found[0]}: only {{port}} takes an offset")
            return host
        value = port + int(found["delta"] or 0)
        if not 0 < value < 65536:
            raise ValueError(f"{template!r} for {url}: port {value} out of range")
        return str(value)

    return _FIELD.sub(one, template)


def _align(backends: Sequence[str], entries: Sequence[str], what: str,
           dynamic: bool = False) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    entries = [e for e in entries if _split(e)[0] != TEMPLATE]
    bare = [e for e in entries if _split(e)[0] is None]
    if bare and len(bare) != len(entries):
        raise ValueError(f"--{what}: use either positional endpoints or URL=endpoint pairs")
    if bare and len(bare) != len(backends):
        raise ValueError(f"--{what}: {len(bare)} endpoints for {len(backends)} backends")
    ids = [b.rstrip("/") for b in backends]
    for i, entry in enumerate(entries):
        url, endpoints = _split(entry)
        url = url if url is not None else ids[i]
        if url not in ids and not dynamic:  # a typo, unless replicas may join later
            raise ValueError(f"--{what}: {url!r} is not a --backend")
        out[url] = expand(endpoints)
    return out


def _template(entries: Sequence[str], what: str) -> str | None:
    found = [_split(e)[1] for e in entries if _split(e)[0] == TEMPLATE]
    if len(found) > 1:
        raise ValueError(f"--{what}: at most one {TEMPLATE}=ENDPOINTS template")
    if found:
        expand(fill(found[0], "http://h:32768"))  # its syntax, checked once up front
    return found[0] if found else None


def _sources(replica: str, endpoints: list[str], replay: list[str] | None) -> list[EventSource]:
    replay_of: list[str | None] = list(replay) if replay is not None else [None] * len(endpoints)
    if len(replay_of) != len(endpoints):
        raise ValueError(f"--kv-events-replay: {len(replay_of)} replay endpoints for "
                         f"{len(endpoints)} event endpoints of {replica}")
    out = []
    for rank, (endpoint, again) in enumerate(zip(endpoints, replay_of, strict=True)):
        bind = endpoint.startswith("bind:")
        out.append(EventSource(replica, endpoint.removeprefix("bind:"), bind, again, rank))
    return out


@dataclass(frozen=True, slots=True)
class EventConfig:
    """The parsed ``--kv-events`` / ``--kv-events-replay`` lists: named replicas' endpoints
    and the template for the rest."""

    named: dict[str, list[str]]
    replays: dict[str, list[str]]
    template: str | None = None
    replay_template: str | None = None

    @classmethod
    def parse(cls, backends: Sequence[str], kv_events: Sequence[str],
              replay: Sequence[str] = (), *, dynamic: bool = False) -> EventConfig:
        """``dynamic``: replicas may join at run time, so ``URL=...`` may name one that is
        not a ``--backend`` (yet)."""
        replay_template = _template(replay, "kv-events-replay")
        template = _template(kv_events, "kv-events")
        if replay_template is not None and template is None:
            raise ValueError(f"--kv-events-replay {TEMPLATE}=...: needs a --kv-events template")
        return cls(_align(backends, kv_events, "kv-events", dynamic),
                   _align(backends, replay, "kv-events-replay", dynamic), template,
                   replay_template)

    @property
    def enabled(self) -> bool:
        return bool(self.named) or self.template is not None

    def sources_for(self, url: str) -> list[EventSource]:
        """The replica's publishers: named in the list, else from the template, else none."""
        url = url.rstrip("/")
        if url in self.named:
            return _sources(url, self.named[url], self.replays.get(url))
        if self.template is None:
            return []
        replay = None if self.replay_template is None else \
            expand(fill(self.replay_template, url))
        return _sources(url, expand(fill(self.template, url)), replay)


def parse_sources(backends: Sequence[str], kv_events: Sequence[str],
                  replay: Sequence[str] = ()) -> list[EventSource]:
    """The ``--kv-events`` / ``--kv-events-replay`` settings: one source per publisher of
    the static ``backends`` (a replica joining later: ``EventConfig.sources_for``)."""
    config = EventConfig.parse(backends, kv_events, replay)
    return [s for b in backends for s in config.sources_for(b)]


@dataclass(slots=True)
class SourceState:
    """Counters and sequence state of one publisher, shown in ``/replicas``."""

    source: EventSource
    last_seq: int | None = None
    batches: int = 0
    restarts: int = 0
    gaps: int = 0
    replayed: int = 0
    cleared: int = 0
    malformed: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    last_batch_at: float | None = None
    group_idx: int | None = field(default=None)

    def as_json(self, now: float) -> dict[str, object]:
        age = None if self.last_batch_at is None else round(now - self.last_batch_at, 3)
        return {
            "endpoint": self.source.endpoint, "replay": self.source.replay, "rank": self.source.rank,
            "last_seq": self.last_seq, "batches": self.batches, "restarts": self.restarts,
            "gaps": self.gaps, "replayed": self.replayed, "cleared": self.cleared,
            "malformed": self.malformed, "blocks_stored": self.blocks_stored,
            "blocks_removed": self.blocks_removed, "last_batch_age_s": age,
        }
