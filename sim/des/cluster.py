"""A simulated deployment: N replica models sharing one pool, and the router's own bookkeeping.

What a policy sees is built the way ``router/`` builds it, not read from the models:

- residency: a ``router.index.memory.MemoryIndex`` (the router's embedded index) that is
  written only when a request completes, with the writes ``router.locator.served_writes``
  gives ``Locator.served`` (without KV events): the chain on the serving replica's GPU,
  and in the pool when the pool is on (LMCache's write-through). The router schedules
  them as an asyncio task; this loop is synchronous, so it applies them with
  ``record_now``. The index therefore lags the models (a prefix is usable from the first
  token but known only after the last), never learns of evictions except by its own LRU
  bound, and keeps believing in a GPU cache an engine restart has emptied.
- ``ReplicaView.in_flight``: the simulated router's count of requests it has outstanding;
  ``waiting``/``running``/``kv_usage``: the engine's metrics read from the model at
  decision time (the router scrapes them; scrape staleness is not modelled).
- ``last_replica``: the replica that last completed a request of the session
  (``router.locator.SessionMemory``, the router's own bounded LRU).

``oracle=True`` swaps the residency source for the models' actual caches (ground truth,
as of the decision time): an upper bound to report beside the real policy, never a policy
input in the router. Index capacities equal the model's (GPU blocks per replica, pool
chunks): ``router.locator.capacity_from_bytes`` of the profile's bytes.

Parameters: ``profile``, ``replicas`` (count; ids ``r0``..), ``pool_on``, ``pool_bytes``
(default: the profile's), ``oracle``.
"""

from __future__ import annotations

from policies.base import ReplicaView, RequestView, Residency
from router.index.memory import MemoryIndex
from router.locator import SessionMemory, capacity_from_bytes, served_writes
from sim.des.loop import EventLoop
from sim.des.workload import SimRequest
from sim.replica.model import ReplicaModel, ReplicaRequest, Timeline
from sim.replica.pool import SharedPool
from sim.replica.profiles import Profile


class Cluster:
    """Replica models, their pool, the router-side index and counters, and one event loop."""

    def __init__(self, profile: Profile, replicas: int, *, pool_on: bool,
                 pool_bytes: int | None = None, oracle: bool = False) -> None:
        if replicas < 1:
            raise ValueError("at least one replica")
        self.profile = profile
        self.loop = EventLoop()
        self.pool = SharedPool(pool_bytes or profile.pool_bytes, profile.chunk_tokens,
                               profile.bytes_per_token, enabled=pool_on)
        self.ids = [f"r{i}" for i in range(replicas)]
        self.models = {rid: ReplicaModel(rid, profile, self.pool) for rid in self.ids}
        self.oracle = oracle
        capacity = capacity_from_bytes(profile.gpu_kv_bytes, self.pool.capacity_bytes,
                                       profile.chunk_tokens, profile.bytes_per_token)
        self.index = MemoryIndex(capacity, clock=self.loop.clock, block_tokens=profile.chunk_tokens)
        self.in_flight = dict.fromkeys(self.ids, 0)
        self.sessions = SessionMemory()

    @property
    def pool_on(self) -> bool:
        return self.pool.enabled

    def residency(self, chain: tuple[int, ...], now: float) -> Residency:
        if not chain:
            return Residency(0, self.profile.chunk_tokens)
        if not self.oracle:
            return self.index.lookup_now(chain)
        gpu = {}
        for rid, model in self.models.items():
            n = model.gpu.longest_prefix(chain, at=now)
            if n:
                gpu[rid] = n
        return Residency(len(chain), self.profile.chunk_tokens, gpu,
                         self.pool.contains_prefix(chain, at=now))

    def request_view(self, request: SimRequest, now: float) -> RequestView:
        return RequestView(
            request_id=request.request_id, model="sim", session=request.session,
            stream=True, prompt_tokens=request.prompt_tokens, max_tokens=request.output_tokens,
            residency=self.residency(request.chain, now),
            last_replica=self.sessions.last(request.session), now=now)

    def replica_views(self, now: float) -> list[ReplicaView]:
        return [
            ReplicaView(rid, f"sim://{rid}", True, self.in_flight[rid],
                        float(m.running(now)), float(m.waiting(now)), m.kv_usage())
            for rid, m in self.models.items()
        ]

    def dispatch(self, request: SimRequest, replica: str, now: float) -> Timeline:
        """Send the request to ``replica``: the model plans it; the router counts it."""
        plan = self.models[replica].admit(ReplicaRequest(
            request.chain, request.prompt_tokens, request.output_tokens, now, request.request_id))
        self.in_flight[replica] += 1
        return plan

    def complete(self, request: SimRequest, replica: str) -> None:
        """The reply ended: what ``Proxy._finished`` and ``Locator.served`` record."""
        self.in_flight[replica] -= 1
        self.sessions.remember(request.session, replica)
        if request.chain:
            for tier, holder in served_writes(replica, precise=False,
                                              pool_write_through=self.pool.enabled):
                self.index.record_now(request.chain, tier, holder)
