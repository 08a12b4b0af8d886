"""Replicas: health, the router's in-flight counts, and the engine load scraped from /metrics.

Health is a small state machine per replica. Active probes GET ``/health`` every
``health_interval_s``; a replica is ejected after ``eject_after`` consecutive failures
(failed probes, or requests that could not connect) and readmitted after ``readmit_after``
consecutive good probes. Ejected replicas get no traffic; the router answers 503 when
none is left. Failures seen on the request path (passive, outlier detection) never eject
more than ``max_ejection_percent`` of the replicas (at least one may go, as in Envoy):
past the cap the replica keeps its traffic until its own probes fail. Which failures
count at all is ``router.failures``' verdict.

Load: ``in_flight`` is counted by the router itself (exact, instant). Every
``scrape_interval_s`` the engine's own view is read from vLLM's Prometheus names
(vLLM's ``vllm/v1/metrics/loggers.py``): ``vllm:num_requests_running``,
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``, summed over the engines
of one replica.

Models: ``ReplicaSet.models`` is ``GET /v1/models`` of the router (the union over healthy
replicas); ``ServedModels`` names the model rooting a replica's KV-event keys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from policies.base import ReplicaView
from router.errors import NoHealthyReplica, UpstreamConnectError
from router.tasks import cancel_all
from router.upstream import Upstream

log = logging.getLogger("lmroute.replicas")

SCRAPED = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
}


@dataclass(slots=True)
class Replica:
    """Mutable state of one replica, owned by the ReplicaSet (one event loop, no locks)."""

    id: str
    url: str
    healthy: bool = True
    fails: int = 0
    goods: int = 0
    in_flight: int = 0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    scraped_at: float | None = None
    in_flight_at_scrape: int | None = None  # ours when the last scrape was read
    last_error: str = ""
    draining: bool = False  # no new requests; in-flight ones finish (router.membership)
    # The last view and the state it shows: a frozen view costs ~1.3 us to build, and every
    # decision asks for every replica's while most have not changed since the last one.
    _view: tuple[tuple[object, ...], ReplicaView] | None = field(
        default=None, repr=False, compare=False)

    def view(self) -> ReplicaView:
        state = (self.id, self.url, self.healthy, self.in_flight, self.running, self.waiting,
                 self.kv_usage, self.in_flight_at_scrape)
        if self._view is not None and self._view[0] == state:
            return self._view[1]
        view = ReplicaView(
            id=self.id,
            url=self.url,
            healthy=self.healthy,
            in_flight=self.in_flight,
            running=self.running,
            waiting=self.waiting,
            kv_usage=self.kv_usage,
            in_flight_at_scrape=self.in_flight_at_scrape,
        )
        self._view = (state, view)
        return view

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "url": self.url,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "draining": self.draining,
            "consecutive_failures": self.fails,
            "scraped": {
                "num_requests_running": self.running,
                "num_requests_waiting": self.waiting,
                "kv_cache_usage_perc": self.kv_usage,
                "at": self.scraped_at,
            },
            "last_error": self.last_error,
        }


async def list_models(upstream: Upstream, url: str, timeout_s: float,
                      headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A replica's ``/v1/models`` entries (objects with an ``id``); [] when it cannot say."""
    try:
        status, body = await upstream.get(url + "/v1/models", timeout_s, headers=headers)
        data = orjson.loads(body).get("data", []) if status == 200 else []
    except (UpstreamConnectError, orjson.JSONDecodeError, AttributeError):
        return []
    return [m for m in data if isinstance(m, dict) and "id" in m]


class ServedModels:
    """The model name rooting a replica's KV-event keys: ``configured`` when set, else the
    replica's first base (non-LoRA) ``/v1/models`` id, asked once and remembered."""

    def __init__(self, upstream: Upstream, timeout_s: float, configured: str = "") -> None:
        self._upstream = upstream
        self._timeout_s = timeout_s
        self._configured = configured
        self._found: dict[str, str] = {}

    async def __call__(self, replica_id: str) -> str | None:
        if self._configured:
            return self._configured
        if replica_id not in self._found:
            data = await list_models(self._upstream, replica_id, self._timeout_s)
            base = [m for m in data if not m.get("parent")]
            if not base:
                return None
            self._found[replica_id] = str(base[0].get("id"))
        return self._found[replica_id]


def parse_engine_load(text: str) -> dict[str, float]:
    """Sum vLLM's load gauges over engines; missing names read as 0."""
    out = dict.fromkeys(SCRAPED.values(), 0.0)
    for family in text_string_to_metric_families(text):
        attr = SCRAPED.get(family.name)
        if attr is None:
            continue
        out[attr] = sum(sample.value for sample in family.samples)
    return out


class ReplicaSet:
    """The replicas behind the router, their probes and scrapes."""

    def __init__(
        self,
        urls: Iterable[str],
        upstream: Upstream,
        *,
        health_interval_s: float,
        health_timeout_s: float,
        eject_after: int,
        readmit_after: int,
        scrape_interval_s: float,
        clock: Callable[[], float],
        max_ejection_percent: float = 50.0,
        on_health_change: Callable[[Replica], None] | None = None,
    ):
        self.replicas = [Replica(id=u.rstrip("/"), url=u.rstrip("/")) for u in urls]
        self.by_id = {r.id: r for r in self.replicas}
        self._upstream = upstream
        self._health_interval_s = health_interval_s
        self._health_timeout_s = health_timeout_s
        self._eject_after = eject_after
        self._readmit_after = readmit_after
        self._scrape_interval_s = scrape_interval_s
        self._max_ejection_percent = max_ejection_percent
        self._clock = clock
        self.on_health_change = on_health_change
        self._tasks: list[asyncio.Task[None]] = []

    # -- views -------------------------------------------------------------------
    def views(self) -> list[ReplicaView]:
        return [r.view() for r in self.replicas]

    async def models(self, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Union of the healthy replicas' ``/v1/models`` entries, the first replica's entry
        winning per id; ``NoHealthyReplica`` when none is healthy."""
        healthy = [r for r in self.replicas if r.healthy]
        if not healthy:
            raise NoHealthyReplica("no healthy replica to list models from")
        listed = await asyncio.gather(*(list_models(self._upstream, r.url,
                                                    self._health_timeout_s, headers)
                                        for r in healthy))
        seen: dict[str, dict[str, Any]] = {}
        for found in listed:
            for m in found:
                seen.setdefault(str(m["id"]), m)
        return list(seen.values())

    def add(self, url: str, *, healthy: bool = True) -> Replica:
        """A replica joins (``router.membership``); an existing URL is returned as is."""
        url = url.rstrip("/")
        if url not in self.by_id:
            self.by_id[url] = Replica(id=url, url=url, healthy=healthy)
            self.replicas = [*self.replicas, self.by_id[url]]
        return self.by_id[url]

    def remove(self, url: str) -> Replica | None:
        """A replica leaves; its in-flight requests hold their ``Replica`` and finish."""
        replica = self.by_id.pop(url.rstrip("/"), None)
        if replica is not None:
            self.replicas = [r for r in self.replicas if r is not replica]
        return replica

    # -- health state machine ------------------------------------------------------
    def _set_health(self, replica: Replica, healthy: bool) -> None:
        if replica.healthy != healthy:
            replica.healthy = healthy
            log.warning("replica %s is now %s", replica.url, "healthy" if healthy else "ejected")
            if self.on_health_change is not None:
                self.on_health_change(replica)

    def _may_eject(self) -> bool:
        ejected = sum(not r.healthy for r in self.replicas)
        cap = max(1, int(len(self.replicas) * self._max_ejection_percent / 100))
        return ejected < cap

    def record_failure(self, replica: Replica, error: str, *, from_probe: bool = False) -> None:
        """A probe or a request could not reach the replica (or it failed a request)."""
        replica.fails += 1
        replica.goods = 0
        replica.last_error = error
        if replica.fails >= self._eject_after and replica.healthy:
            if from_probe or self._may_eject():
                self._set_health(replica, False)
            elif replica.fails == self._eject_after:
                log.warning("replica %s not ejected: %g%% of the replicas are out already",
                            replica.url, self._max_ejection_percent)

    def record_success(self, replica: Replica, *, from_probe: bool) -> None:
        replica.fails = 0
        if replica.healthy:
            return
        if from_probe:
            replica.goods += 1
            if replica.goods >= self._readmit_after:
                replica.goods = 0
                self._set_health(replica, True)

    async def probe(self, replica: Replica) -> None:
        try:
            status, _ = await self._upstream.get(replica.url + "/health", self._health_timeout_s)
        except UpstreamConnectError as exc:
            self.record_failure(replica, str(exc), from_probe=True)
            return
        if status == 200:
            self.record_success(replica, from_probe=True)
        else:
            self.record_failure(replica, f"/health answered {status}", from_probe=True)

    async def scrape(self, replica: Replica) -> None:
        try:
            status, body = await self._upstream.get(replica.url + "/metrics", self._health_timeout_s)
        except UpstreamConnectError:
            return  # health probing owns failure accounting
        if status != 200:
            return
        try:
            load = parse_engine_load(body.decode("utf-8", "replace"))
        except ValueError as exc:  # not Prometheus text: keep the last good values
            replica.last_error = f"/metrics unparsable: {exc}"
            return
        replica.running = load["running"]
        replica.waiting = load["waiting"]
        replica.kv_usage = load["kv_usage"]
        replica.scraped_at = self._clock()
        replica.in_flight_at_scrape = replica.in_flight

    # -- background loops ------------------------------------------------------------
    async def _loop(self, period: float, action: Callable[[Replica], Awaitable[None]]) -> None:
        while True:
            await asyncio.gather(*(action(r) for r in self.replicas))
            await asyncio.sleep(period)

    def start(self) -> None:
        if self._health_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._loop(self._health_interval_s, self.probe)))
        if self._scrape_interval_s > 0:
            self._tasks.append(
                asyncio.create_task(self._loop(self._scrape_interval_s, self.scrape))
            )

    async def stop(self) -> None:
        await cancel_all(self._tasks)
