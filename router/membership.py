"""Replicas that come and go: the admin API, a watched file, and DNS names.

Each replica in the set is wanted by one or more *origins*: ``static`` (``--backend URL``),
``admin`` (the admin API), ``file`` (``--backends-file``) and ``dns:ENTRY`` (one
``--backend dns+SCHEME://NAME:PORT``). ``sync(origin, urls)`` makes an origin want exactly
``urls``; a replica joins when its first origin wants it and leaves when none does.

Joining: one ``/health`` probe decides whether the replica starts healthy (an answering
one takes traffic at once; otherwise the periodic probes readmit it), its ``/v1/models``
is read (``router.models``), and it gets the next replica-header name. Leaving: it is
out of the set at once (no new request goes there; requests in flight hold it and
finish), its KV-event subscribers stop (``watchers``), and what the index, the model map
and the response-id map believed about it is forgotten. A joining replica's KV-event
sources come from the ``--kv-events`` list or its ``*=`` template
(``router.event_sources``). Draining (admin API): the replica stays, its in-flight
requests finish, and it gets no new request, not even of a session that was on it
(``router.models``).

Sources, each re-checked by a background loop:
  - ``--backends-file PATH``: one URL per line, blank lines and ``#`` comments ignored;
    re-read when its mtime or size changes (polled every ``backends_poll_s``). A file
    that cannot be read keeps the last set.
  - ``--backend dns+http://NAME:PORT``: every address NAME resolves to is a replica
    ``http://ADDRESS:PORT`` (a Kubernetes headless service), re-resolved every
    ``dns_interval_s``; a failed resolution keeps the last set. ``--dns-hosts-file``
    resolves from a hosts-style file instead (``ADDRESS NAME...`` lines, every line
    naming NAME counts), for tests and for fixed fleets.
  - admin API (access "admin", ``router.gate``): ``GET /admin/replicas``,
    ``POST /admin/replicas {"url"}``, ``DELETE /admin/replicas {"url"}`` (whatever
    origin wanted it; a file or DNS name still listing it brings it back at its next
    change), ``POST /admin/replicas/drain {"url", "drain": true|false}``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from router.errors import UpstreamConnectError
from router.gate import Gate
from router.locator import Locator
from router.models import ModelMap
from router.replicas import ReplicaSet
from router.response_ids import ResponseIds
from router.tasks import cancel_all
from router.upstream import Upstream

log = logging.getLogger("lmroute.membership")
DNS_PREFIX = "dns+"
# A replica URL: http(s), an ASCII host name or address (IPv6 in brackets), an optional
# port and path; no query, fragment, user info, spaces or control characters.
_REPLICA_URL = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)"
                          r"(:[0-9]{1,5})?(/[!-\"$-~]*)?")


class Watcher(Protocol):
    """Told of each replica joining (after it is in the set) and leaving (before the index
    forgets it): the KV-event subscribers (``router.events.EngineEvents``)."""

    def joined(self, replica: str) -> None: ...

    async def left(self, replica: str) -> None: ...


def split_backends(backends: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--backend`` values as (replica URLs, ``dns+`` entries)."""
    return ([b for b in backends if not b.startswith(DNS_PREFIX)],
            [b for b in backends if b.startswith(DNS_PREFIX)])


def replica_url(url: str) -> str | None:
    """``url`` without its trailing ``/`` if it is a replica URL the router can use, else
    None (the admin API answers 400; a file's line is skipped)."""
    if not _REPLICA_URL.fullmatch(url) or "?" in url:
        return None
    try:
        port = urlsplit(url).port
    except ValueError:  # a port above 65535, or an IPv6 literal urllib rejects
        return None
    return url.rstrip("/") if port is None or port > 0 else None


def read_backends_file(path: str) -> list[str]:
    out = []
    for line in Path(path).read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        url = replica_url(text)
        if url is None:
            log.warning("--backends-file %s: not a replica URL, skipped: %r", path, text)
        else:
            out.append(url)
    return out


def hosts_lookup(path: str, name: str) -> list[str]:
    """Every address a hosts-style file gives ``name``."""
    found = []
    for line in Path(path).read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) >= 2 and name in fields[1:]:
            found.append(fields[0])
    return found


@dataclass(frozen=True, slots=True)
class DnsBackend:
    entry: str  # as given: dns+http://NAME:PORT
    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, entry: str) -> DnsBackend:
        parts = urlsplit(entry.removeprefix(DNS_PREFIX))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--backend {entry}: expected dns+http://NAME:PORT")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(entry, parts.scheme, parts.hostname, port)

    def url(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{host}:{self.port}"


class Membership:
    """The replica set's membership, from every origin."""

    def __init__(self, replicas: ReplicaSet, upstream: Upstream, *, gate: Gate,
                 locator: Locator, models: ModelMap, ids: ResponseIds, probe_timeout_s: float,
                 backends_file: str = "", backends_poll_s: float = 1.0,
                 dns: Sequence[str] = (), dns_interval_s: float = 5.0,
                 dns_hosts_file: str = "") -> None:
        self.replicas, self.upstream, self.gate = replicas, upstream, gate
        self.locator, self.models, self.ids = locator, models, ids
        self.probe_timeout_s = probe_timeout_s
        self.origins: dict[str, set[str]] = {r.url: {"static"} for r in replicas.replicas}
        self.backends_file = backends_file
        self.backends_poll_s = backends_poll_s
        self.dns = [DnsBackend.parse(e) for e in dns]
        self.dns_interval_s = dns_interval_s
        self.dns_hosts_file = dns_hosts_file
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.watchers: list[Watcher] = []

    # -- joining and leaving ------------------------------------------------------------
    async def join(self, url: str, origin: str) -> None:
        url = url.rstrip("/")
        if url not in self.replicas.by_id:
            try:
                status, _ = await self.upstream.get(url + "/health", self.probe_timeout_s)
            except UpstreamConnectError:
                status = 0
            replica = self.replicas.add(url, healthy=status == 200)
            self.gate.name_of(url)
            await self.models.fetch(replica)
            for watcher in self.watchers:
                watcher.joined(url)
            log.warning("replica %s joined (%s, %s)", url, origin,
                        "healthy" if replica.healthy else "not answering yet")
        self.origins.setdefault(url, set()).add(origin)

    async def leave(self, url: str, origin: str | None) -> bool:
        """``origin`` no longer wants ``url`` (``None``: no origin does); whether it left."""
        url = url.rstrip("/")
        wanted = self.origins.get(url, set())
        if origin is None:
            wanted.clear()
        else:
            wanted.discard(origin)
        if wanted or self.replicas.remove(url) is None:
            return False
        self.origins.pop(url, None)
        for watcher in self.watchers:  # first: no event may re-add what is forgotten below
            await watcher.left(url)
        self.models.forget(url)
        await self.ids.forget_replica(url)
        await self.locator.forget(url)
        log.warning("replica %s left", url)
        return True

    async def sync(self, origin: str, urls: Sequence[str]) -> None:
        """Make ``origin`` want exactly ``urls``."""
        async with self._lock:
            wanted = {u.rstrip("/") for u in urls}
            had = {u for u, o in self.origins.items() if origin in o}
            for url in sorted(wanted - had):
                await self.join(url, origin)
            for url in sorted(had - wanted):
                await self.leave(url, origin)

    async def admit(self, url: str) -> None:
        """The admin API adds ``url``."""
        async with self._lock:
            await self.join(url, "admin")

    async def evict(self, url: str) -> bool:
        """The admin API removes ``url`` now, whatever origin wanted it."""
        async with self._lock:
            return await self.leave(url, None)

    def drain(self, url: str, on: bool) -> bool:
        replica = self.replicas.by_id.get(url.rstrip("/"))
        if replica is None:
            return False
        replica.draining = on
        return True

    # -- sources ---------------------------------------------------------------------------
    async def _watch_file(self) -> None:
        seen: tuple[float, int] | None = None
        while True:
            try:
                st = os.stat(self.backends_file)
                if (st.st_mtime, st.st_size) != seen:
                    urls = read_backends_file(self.backends_file)
                    seen = (st.st_mtime, st.st_size)
                    await self.sync("file", urls)
            except OSError as exc:
                log.warning("--backends-file %s unreadable, keeping the last set: %r",
                            self.backends_file, exc)
            await asyncio.sleep(self.backends_poll_s)

    async def resolve(self, backend: DnsBackend) -> list[str]:
        if self.dns_hosts_file:
            return hosts_lookup(self.dns_hosts_file, backend.host)
        infos = await asyncio.get_running_loop().getaddrinfo(
            backend.host, backend.port, type=socket.SOCK_STREAM)
        return sorted({str(info[4][0]) for info in infos})

    async def _watch_dns(self) -> None:
        while True:
            for backend in self.dns:
                try:
                    addresses = await self.resolve(backend)
                except OSError as exc:
                    log.warning("%s did not resolve, keeping the last set: %r",
                                backend.entry, exc)
                    continue
                await self.sync(f"dns:{backend.entry}", [backend.url(a) for a in addresses])
            await asyncio.sleep(self.dns_interval_s)

    def start(self) -> None:
        if self.backends_file:
            self._tasks.append(asyncio.create_task(self._watch_file()))
        if self.dns:
            self._tasks.append(asyncio.create_task(self._watch_dns()))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
