"""Prefixes on their way into a replica's cache: the router's own dispatches, until settled.

The index learns a prefix late: from the engine's KV events once the blocks are computed
(precise mode), or from the router's own record once the reply ends (approximate mode).
Between the dispatch and then, a second request sharing the prefix (another session on
the same system prompt or document, the next request of a ``prefix_repetition`` burst)
looks cold everywhere and is placed by load alone, so the prefix is computed twice. On two
real vLLM engines that was half of ``locality``'s cold placements (docs/locality.md).
SGLang's router avoids it by inserting a request's text into its tree when it routes it;
this is the same idea beside an index the router does not own.

``InFlightPrefixes`` holds, per replica, a reference count for every block key of every
request dispatched to it and not yet settled (its reply ended, failed or was abandoned).
``longest(chain, replica)`` is how many leading blocks of ``chain`` are among them. A
block key is a chain hash (it determines every block before it), and every dispatch adds
its whole chain, so the set held for a replica is closed under prefixes: if block ``i``
of ``chain`` is held, so are blocks ``0..i-1``. The longest match is therefore found by
bisection, ``O(log n)`` lookups per replica, and ``0`` after one lookup when the first block
is not held (the common case). ``overlay(residency, chain)`` raises each replica's GPU
count in a ``Residency`` to its in-flight match: a request queued behind the one computing
its prefix finds it computed (the engine's scheduler is FIFO), which is what a policy
should expect of that replica.

Adding costs one dictionary update per block (a 128k-token prompt in 32-token blocks:
4,000); settling the same. Synchronous and free of I/O, so the simulator
(``sim/des/cluster.py``) keeps its routers' view with exactly this code.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import ReplicaId, Residency


class InFlightPrefixes:
    """Block keys of unsettled dispatches, per replica, with the request that added them."""

    def __init__(self) -> None:
        self._blocks: dict[ReplicaId, dict[int, int]] = {}  # replica -> key -> refcount
        self._requests: dict[str, tuple[ReplicaId, Sequence[int]]] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, request_id: str, replica: ReplicaId, chain: Sequence[int]) -> None:
        """``request_id`` was sent to ``replica`` (a previous attempt of it is settled)."""
        self.settle(request_id)
        if not chain:
            return
        self._requests[request_id] = (replica, chain)
        held = self._blocks.setdefault(replica, {})
        for key in chain:
            held[key] = held.get(key, 0) + 1

    def settle(self, request_id: str) -> None:
        """The request's reply ended, failed or was abandoned: its blocks are the index's
        business from now on (or were never computed)."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        replica, chain = entry
        held = self._blocks[replica]
        for key in chain:
            count = held[key] - 1
            if count:
                held[key] = count
            else:
                del held[key]
        if not held:
            del self._blocks[replica]

    def forget(self, replica: ReplicaId) -> None:
        """The replica is gone (ejected): what was on its way there will not be cached."""
        self._blocks.pop(replica, None)
        for rid in [r for r, (rep, _) in self._requests.items() if rep == replica]:
            del self._requests[rid]

    def longest(self, chain: Sequence[int], replica: ReplicaId) -> int:
        """Leading blocks of ``chain`` that unsettled dispatches to ``replica`` hold."""
        held = self._blocks.get(replica)
        if not held or not chain or chain[0] not in held:
            return 0
        lo, hi = 1, len(chain)  # chain[:lo] is held; find the largest such lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if chain[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def overlay(self, residency: Residency, chain: Sequence[int]) -> Residency:
        """``residency`` with each replica's GPU prefix at least its in-flight match, and
        ``readers``: the unsettled dispatches, on any replica, that hold the request's
        longest prefix the index holds (the deepest of its GPU and pool prefixes) in full. They are
        the request's company in reading it right now: many of them make that prefix hot,
        and a second copy of it worth its computation (``policies.locality``)."""
        if not self._blocks or not chain:
            return residency
        gpu = None
        for replica in self._blocks:
            n = self.longest(chain, replica)
            if n > residency.gpu.get(replica, 0):
                if gpu is None:
                    gpu = dict(residency.gpu)
                gpu[replica] = n
        # Only a prefix computed somewhere (the index holds it): one still being computed
        # for the first time is better waited for (it reaches the pool, or its replica's
        # cache, when done) than computed again.
        deepest = max(max(residency.gpu.values(), default=0), residency.pool)
        readers = 0
        if deepest:
            key = chain[min(deepest, len(chain)) - 1]
            readers = sum(held.get(key, 0) for held in self._blocks.values())
        if gpu is None and readers == residency.readers:
            return residency
        return Residency(residency.chain_blocks or len(chain), residency.block_tokens,
                         residency.gpu if gpu is None else gpu, residency.pool, readers)
