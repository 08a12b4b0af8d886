"""A simulated deployment: N replica models sharing one pool, and R routers in front of them.

Production runs several router processes behind a plain L4/L7 load balancer; each router
knows only the requests it routed itself. The simulator models that with one ``SimRouter``
per router, each holding its own bookkeeping, built the way ``router/`` builds it (not read
from the models):

- residency: a ``router.index.memory.MemoryIndex`` (the router's embedded index) that is
  written only when a request *this router* served completes, with the writes
  ``router.locator.record_served`` makes for ``Locator.served`` (without KV events): the chain
  on the serving replica's GPU, and in the pool when the pool is on (LMCache's
  write-through). The router applies them at once to its in-memory index (with Redis, in
  a background task); this loop does the same with ``record_now``. The index therefore
  lags the models (a prefix is usable from the first token but known only after the
  last), never learns of evictions except by its own LRU bound, keeps believing in a GPU
  cache an engine restart has emptied, and never learns of a prefix another router served
  (even one in the shared pool).
  Laid over it, as ``Locator.residency`` does, the router's unsettled dispatches
  (``router.in_flight.InFlightPrefixes``: added at dispatch, settled at completion).
- ``ReplicaView.in_flight``: this router's count of requests it has outstanding (other
  routers' requests are invisible to it, except through the engine metrics);
  ``waiting``/``running``/``kv_usage``: the engines' metrics, shared truth read from the
  models, but as of this router's last scrape (see ``scrape_interval_s``).
- ``last_replica``: the replica that last completed a request of the session *through this
  router* (``router.locator.SessionMemory``, the router's own bounded LRU).

The load balancer (``Balancer``) hands each request to a router without session affinity:
``random`` (default) draws a router uniformly per request from the injected ``rng``,
``round-robin`` takes them in turn. A session's turns therefore spread over the routers,
as they do in a fleet whose balancer has no affinity. With one router nothing is drawn.

``oracle=True`` swaps every router's residency source for the models' actual caches
(ground truth, as of the decision time, one per cluster): an upper bound to report beside
the real policy, never a policy input in the router. Index capacities equal the model's
(GPU blocks per replica, pool chunks): ``router.locator.capacity_from_bytes`` of the
profile's bytes. The pool is one per cluster, shared by all routers' requests.

``shared_index=True`` gives every router one index (the deployment with ``--index redis://...``:
routers write what they served into one Redis index and all read it), still written only
on completion of a request by the router that served it; in-flight counts, session memory
and policies stay each router's own (lmroute keeps those in process).

Parameters: ``profile``, ``replicas`` (count; ids ``r0``..), ``pool_on``, ``pool_bytes``
(default: the profile's), ``oracle``, ``routers`` (count, default 1), ``scrape_interval_s``
(0: metrics fresh at decision time; > 0: router ``i`` scrapes at ``phase_i + k *
interval`` for every integer ``k``, ``phase_i = i * interval / routers``, staggered so the
routers' views differ), ``balancer`` (``random`` | ``round-robin``), ``rng`` (the
balancer's ``random.Random``; default ``Random(0)``), ``shared_index`` (above). With
``routers=1`` and ``scrape_interval_s=0`` the cluster behaves exactly as the single-router
simulator did.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from policies.base import ReplicaView, RequestView, Residency, anchor_key
from router.in_flight import InFlightPrefixes
from router.index.memory import MemoryIndex
from router.locator import SessionMemory, capacity_from_bytes, record_served
from sim.des.loop import EventLoop
from sim.des.workload import SimRequest
from sim.replica.model import ReplicaModel, ReplicaRequest, Timeline
from sim.replica.pool import SharedPool
from sim.replica.profiles import Profile

BALANCERS = ("random", "round-robin")

# (running, waiting, kv_usage) of one engine as a scrape reads them, and the router's own
# in-flight count there at that moment.
Metrics = tuple[float, float, float, int]


class Balancer:
    """The plain load balancer in front of the routers: no session affinity, no load view.

    ``mode``: ``random`` (a uniform draw per request from ``rng``) or ``round-robin``.
    With one router it returns 0 and never touches ``rng``, so a single-router run draws
    nothing more than it did before routers were modelled.
    """

    def __init__(self, routers: int, mode: str, rng: random.Random) -> None:
        if mode not in BALANCERS:
            raise ValueError(f"balancer {mode!r}: one of {', '.join(BALANCERS)}")
        self.routers = routers
        self.mode = mode
        self.rng = rng
        self._next = 0

    def pick(self) -> int:
        if self.routers == 1:
            return 0
        if self.mode == "round-robin":
            chosen, self._next = self._next, (self._next + 1) % self.routers
            return chosen
        return self.rng.randrange(self.routers)


class SimRouter:
    """One router process: its index, in-flight counts, session memory and metric scrapes.

    ``number`` is its position (0..R-1, the ``Record.router``); ``phase_s`` the offset of its
    scrape schedule. It reaches the engines (and, with ``oracle``, the ground truth) through
    ``cluster``; everything else it knows it learned from its own requests.
    """

    def __init__(self, number: int, cluster: Cluster, phase_s: float,
                 index: MemoryIndex | None = None) -> None:
        self.number = number
        self.cluster = cluster
        self.index = index or cluster.new_index()
        self.in_flight = dict.fromkeys(cluster.ids, 0)
        self.sessions = SessionMemory()
        self.dispatches = InFlightPrefixes()
        self.phase_s = phase_s
        self.scraped_at = -math.inf  # time of the scrape held in ``metrics``
        self.metrics: dict[str, Metrics] = {}
        self._ended: list[tuple[float, str]] = []  # replies ended since the last scrape read

    def last_scrape_time(self, now: float) -> float:
        """The latest time ``<= now`` of this router's schedule ``phase + k * interval``."""
        interval = self.cluster.scrape_interval_s
        return self.phase_s + math.floor((now - self.phase_s) / interval) * interval

    def scrape(self, now: float) -> None:
        """Take the scrape due by ``now`` unless it is held already.

        The cluster calls this before every admission; only admissions change what an
        engine reports, and between two of them ``waiting(t)``/``running(t)`` are exact
        for any ``t`` at or after the earlier one, so the values read are those at the
        scrape time itself, without scrape events in the loop. A scrape at the instant of
        an arrival reads the engines before it is admitted. The router's own in-flight
        count at the scrape time is today's plus the replies that ended since (no dispatch
        of its own came in between, or the scrape would have been read then).
        """
        if self.cluster.scrape_interval_s <= 0:
            return
        at = self.last_scrape_time(now)
        if at <= self.scraped_at:
            return
        self.scraped_at = at
        own = dict(self.in_flight)
        for ended, rid in self._ended:
            if ended > at:
                own[rid] += 1
        self._ended.clear()
        self.metrics = {rid: (float(m.running(at)), float(m.waiting(at)), m.kv_usage(), own[rid])
                        for rid, m in self.cluster.models.items()}

    def engine_metrics(self, rid: str, now: float) -> Metrics:
        if self.cluster.scrape_interval_s <= 0:
            m = self.cluster.models[rid]
            return float(m.running(now)), float(m.waiting(now)), m.kv_usage(), self.in_flight[rid]
        self.scrape(now)
        return self.metrics[rid]

    def residency(self, chain: tuple[int, ...], now: float) -> Residency:
        if not chain:
            return Residency(0, self.cluster.profile.chunk_tokens)
        if self.cluster.oracle:
            return self.cluster.true_residency(chain, now)
        return self.dispatches.overlay(self.index.lookup_now(chain), chain)

    def request_view(self, request: SimRequest, now: float) -> RequestView:
        return RequestView(
            request_id=request.request_id, model="sim", session=request.session,
            stream=True, prompt_tokens=request.prompt_tokens, max_tokens=request.output_tokens,
            residency=self.residency(request.chain, now),
            last_replica=self.sessions.last(request.session), now=now,
            anchor=anchor_key(request.chain, self.cluster.profile.chunk_tokens))

    def replica_views(self, now: float) -> list[ReplicaView]:
        views = []
        for rid in self.cluster.ids:
            running, waiting, kv_usage, own = self.engine_metrics(rid, now)
            views.append(ReplicaView(rid, f"sim://{rid}", True, self.in_flight[rid],
                                     running, waiting, kv_usage, own))
        return views

    def complete(self, request: SimRequest, replica: str, now: float) -> None:
        """The reply ended: what ``Proxy._finished`` and ``Locator.served`` record."""
        self.in_flight[replica] -= 1
        if self.cluster.scrape_interval_s > 0:
            self._ended.append((now, replica))
        self.dispatches.settle(request.request_id)
        self.sessions.remember(request.session, replica)
        if request.chain:
            record_served(self.index, request.chain, replica, precise=False,
                          pool_write_through=self.cluster.pool.enabled)


class Cluster:
    """Replica models, their pool, the routers in front of them, and one event loop."""

    def __init__(self, profile: Profile, replicas: int, *, pool_on: bool,
                 pool_bytes: int | None = None, oracle: bool = False, routers: int = 1,
                 scrape_interval_s: float = 0.0, balancer: str = "random",
                 rng: random.Random | None = None,
                 replica_profiles: Mapping[str, Profile] | None = None,
                 shared_index: bool = False) -> None:
        if replicas < 1:
            raise ValueError("at least one replica")
        if routers < 1:
            raise ValueError("at least one router")
        if scrape_interval_s < 0 or not math.isfinite(scrape_interval_s):
            raise ValueError("scrape_interval_s must be finite and >= 0")
        self.profile = profile
        self.loop = EventLoop()
        self.pool = SharedPool(pool_bytes or profile.pool_bytes, profile.chunk_tokens,
                               profile.bytes_per_token, enabled=pool_on)
        self.ids = [f"r{i}" for i in range(replicas)]
        # A heterogeneous fleet: some replicas' physics differ (``replica_profiles`` by id);
        # the routers' capacity model stays the fleet's ``profile``, as a router's would.
        own = replica_profiles or {}
        unknown = set(own) - set(self.ids)
        if unknown:
            raise ValueError(f"replica_profiles names no replica: {sorted(unknown)}")
        self.models = {rid: ReplicaModel(rid, own.get(rid, profile), self.pool)
                       for rid in self.ids}
        self.oracle = oracle
        self.scrape_interval_s = scrape_interval_s
        self.balancer = Balancer(routers, balancer, rng or random.Random(0))
        shared = self.new_index() if shared_index else None
        self.routers = [SimRouter(i, self, i * scrape_interval_s / routers, shared)
                        for i in range(routers)]

    def new_index(self) -> MemoryIndex:
        """A router's index: capacities from the profile's bytes, the loop's clock."""
        p = self.profile
        capacity = capacity_from_bytes(p.gpu_kv_bytes, self.pool.capacity_bytes,
                                       p.chunk_tokens, p.bytes_per_token)
        return MemoryIndex(capacity, clock=self.loop.clock, block_tokens=p.chunk_tokens)

    @property
    def pool_on(self) -> bool:
        return self.pool.enabled

    @property
    def router(self) -> SimRouter:
        """The only router of a single-router cluster (its index, in-flight, sessions)."""
        if len(self.routers) != 1:
            raise ValueError(f"{len(self.routers)} routers: pick one of cluster.routers")
        return self.routers[0]

    def true_residency(self, chain: tuple[int, ...], now: float) -> Residency:
        """Ground truth from the models (``oracle``): every GPU's prefix and the pool's."""
        gpu = {}
        for rid, model in self.models.items():
            n = model.gpu.longest_prefix(chain, at=now)
            if n:
                gpu[rid] = n
        return Residency(len(chain), self.profile.chunk_tokens, gpu,
                         self.pool.contains_prefix(chain, at=now))

    def route(self) -> SimRouter:
        """The router the load balancer hands the next arriving request to."""
        return self.routers[self.balancer.pick()]

    def dispatch(self, request: SimRequest, replica: str, now: float,
                 router: SimRouter | None = None) -> Timeline:
        """Send the request to ``replica``: the model plans it; ``router`` counts it."""
        router = router or self.router
        # Every router takes the scrape due before this admission changes the engine.
        for r in self.routers:
            r.scrape(now)
        plan = self.models[replica].admit(ReplicaRequest(
            request.chain, request.prompt_tokens, request.output_tokens, now, request.request_id))
        router.in_flight[replica] += 1
        router.dispatches.add(request.request_id, replica, request.chain)
        return plan

    def complete(self, request: SimRequest, replica: str, now: float,
                 router: SimRouter | None = None) -> None:
        """The reply ended: the router that sent it records it (``SimRouter.complete``)."""
        (router or self.router).complete(request, replica, now)
