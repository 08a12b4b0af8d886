"""The only place router metrics are recorded (Prometheus client, one registry per app).

Counters and histograms are private to ``RouterMetrics``: the proxy, the locator, the
index and the app record through its methods (``decision``, ``request_done``, ...);
every request metric carries an ``arm`` label: the A/B arm of ``policies.split`` that
routed it, "" when the policy is not a split; the ones every request records
(requests, decisions, TTFT, duration, overhead, index lookups) are ``router.tallies``
instruments (no lock per increment), the rare ones prometheus_client's own;
replica gauges (health, in-flight, scraped engine load) are read from the ReplicaSet at
scrape time by a collector, so there is no second copy of that state to drift.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.replicas import ReplicaSet
from router.tallies import Spread, Tally, TallyCollector

# Seconds; LLM latencies span milliseconds (pool hits, router overhead) to minutes (cold
# 256k prefills: 92 s in the study).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0,
)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class _ReplicaCollector(Collector):
    def __init__(self, replicas: ReplicaSet):
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily("lmroute_replica_healthy", "1 if routable", labels=["replica"])
        in_flight = GaugeMetricFamily(
            "lmroute_replica_in_flight", "requests the router has outstanding", labels=["replica"]
        )
        running = GaugeMetricFamily(
            "lmroute_replica_running", "scraped vllm:num_requests_running", labels=["replica"]
        )
        waiting = GaugeMetricFamily(
            "lmroute_replica_waiting", "scraped vllm:num_requests_waiting", labels=["replica"]
        )
        kv = GaugeMetricFamily(
            "lmroute_replica_kv_cache_usage", "scraped vllm:kv_cache_usage_perc", labels=["replica"]
        )
        for r in self._replicas.replicas:
            healthy.add_metric([r.url], 1.0 if r.healthy else 0.0)
            in_flight.add_metric([r.url], r.in_flight)
            running.add_metric([r.url], r.running)
            waiting.add_metric([r.url], r.waiting)
            kv.add_metric([r.url], r.kv_usage)
        yield from (healthy, in_flight, running, waiting, kv)


class _IndexCollector(Collector):
    """``lmroute_index_degraded`` (1 while the shared index is down and local memory
    answers) and the adaptive lookup timeout, read from the index at scrape time."""

    def __init__(self, index: object):
        self._index = index

    def collect(self) -> Iterator[Metric]:
        degraded = GaugeMetricFamily("lmroute_index_degraded",
                                     "1 while the shared prefix index is unavailable")
        degraded.add_metric([], 1.0 if getattr(self._index, "degraded", False) else 0.0)
        yield degraded
        timeout = getattr(self._index, "lookup_timeout", None)
        if timeout is not None:
            yield GaugeMetricFamily("lmroute_index_lookup_timeout_seconds",
                                    "the adaptive shared-index lookup timeout",
                                    value=float(timeout.value_s))


def _canary_metrics(r: CollectorRegistry) -> tuple[Counter, Gauge]:
    """The live canary's (router.canary): results, and whether the pool is suspect."""
    return (Counter("lmroute_canaries", "live canaries by result (router.canary): clean, "
                    "diverged, no_pool_path, over_budget, error", ["result"], registry=r),
            Gauge("lmroute_pool_suspect", "1 while a canary found the shared pool's replies "
                  "wrong (the pool tier is then treated as absent)", registry=r))


class RouterMetrics:
    """Router metrics on a private registry (no process globals: several apps per process)."""

    def __init__(self, replicas: ReplicaSet):
        self.registry = CollectorRegistry()
        r = self.registry
        # The request path's own (router.tallies: no lock, no linear bucket scan).
        self._requests = Tally("lmroute_requests", "proxied requests by outcome",
                               ["endpoint", "replica", "status", "arm"])
        self._decisions = Tally("lmroute_decisions", "policy decisions",
                                ["policy", "reason", "arm"])
        self._retries = Counter(
            "lmroute_retries", "requests re-sent to another replica (failover)",
            ["replica", "arm"], registry=r,
        )
        self._upstream_errors = Counter(
            "lmroute_upstream_errors", "failed attempts seen on the request path (kind "
            "request_*/suspect_*: 5xx not counted against the replica, router.failures)",
            ["replica", "kind", "arm"], registry=r,
        )
        self._client_errors = Counter(
            "lmroute_client_errors", "requests refused by the router itself", ["code"], registry=r
        )
        self._disconnects = Counter(
            "lmroute_client_disconnects", "clients gone before their reply ended (upstream "
            "request cancelled)", ["phase"], registry=r,
        )
        self._ttft = Spread(
            "lmroute_time_to_first_byte_seconds",
            "router receipt to first body byte from the replica (TTFT when streaming)",
            ["replica", "arm"], LATENCY_BUCKETS)
        self._duration = Spread("lmroute_request_duration_seconds",
                                "router receipt to last byte", ["replica", "arm"], LATENCY_BUCKETS)
        self._canaries, self._pool_suspect = _canary_metrics(r)
        self._overhead = Spread("lmroute_routing_overhead_seconds",
                                "parse + lookup + choose, before the upstream send", [],
                                OVERHEAD_BUCKETS)
        self._ttft_ratio = Spread(
            "lmroute_ttft_observed_over_predicted",
            "observed TTFT / the policy's predicted TTFT (1 = exact; policies that predict)",
            ["replica", "arm"], (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0))
        self._index_lookups = Tally("lmroute_index_lookups",
                                    "prefix index lookups by the best tier found", ["tier"])
        self._index_lookup = Spread("lmroute_index_lookup_seconds",
                                    "one prefix index lookup (one round trip)", [],
                                    OVERHEAD_BUCKETS)
        self._index_errors = Counter(
            "lmroute_index_errors", "index failures (the request went on without it)",
            ["kind"], registry=r,
        )
        r.register(_ReplicaCollector(replicas))
        r.register(TallyCollector([self._requests, self._decisions, self._ttft, self._duration,
                                   self._overhead, self._ttft_ratio, self._index_lookups,
                                   self._index_lookup]))

    # -- the request path -------------------------------------------------------------
    def refused(self, code: str) -> None:
        """The router itself refused a request (bad body, too large, nothing to route to)."""
        self._client_errors.labels(code).inc()

    def decision(self, policy: str, reason: str, arm: str) -> None:
        self._decisions.add((policy, reason, arm))

    def retry(self, replica: str, arm: str) -> None:
        """A request re-sent to ``replica`` after another failed it (failover)."""
        self._retries.labels(replica, arm).inc()

    def routing_overhead(self, seconds: float) -> None:
        self._overhead.observe((), seconds)

    def canary(self, result: str) -> None:
        self._canaries.labels(result=result).inc()

    def pool_suspect(self, suspect: bool) -> None:
        self._pool_suspect.set(1.0 if suspect else 0.0)

    def client_disconnect(self, phase: str) -> None:
        """A client left; ``phase``: ``before_reply`` (no byte sent yet) or ``mid_stream``."""
        self._disconnects.labels(phase).inc()

    def upstream_error(self, replica: str, kind: str, arm: str) -> None:
        self._upstream_errors.labels(replica, kind, arm).inc()

    def request_done(self, endpoint: str, replica: str, status: int, arm: str, *,
                     duration_s: float | None = None, ttft_s: float | None = None,
                     predicted_ttft_s: float | None = None) -> None:
        """One proxied request answered by ``replica``: count, durations, TTFT accuracy."""
        self._requests.add((endpoint, replica, status, arm))
        if duration_s is not None:
            self._duration.observe((replica, arm), duration_s)
        if ttft_s is not None:
            self._ttft.observe((replica, arm), ttft_s)
            if predicted_ttft_s:
                self._ttft_ratio.observe((replica, arm), ttft_s / predicted_ttft_s)

    # -- the prefix index -----------------------------------------------------------------
    def index_lookup(self, seconds: float, tier: str) -> None:
        """One lookup took ``seconds``; ``tier`` is the best tier it found."""
        self._index_lookup.observe((), seconds)
        self._index_lookups.add((tier,))

    def index_error(self, kind: str) -> None:
        """The index failed (``kind``: lookup, record, template, events, ...); the request
        went on without it."""
        self._index_errors.labels(kind).inc()

    def watch_index(self, index: object) -> None:
        """Export the index's health (``lmroute_index_degraded``) from now on."""
        self.registry.register(_IndexCollector(index))

    def render(self) -> bytes:
        return generate_latest(self.registry)
