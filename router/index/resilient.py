"""A PrefixIndex that keeps answering when the shared one (Redis) is down or slow.

Every record goes to a local ``MemoryIndex`` (the fallback) and to the primary (Redis);
lookups ask the primary and fall back to local memory on an error or after the lookup
timeout. The timeout adapts (``LookupTimeout``): ``timeout_multiple`` (4) x the p99 of
the last ``window`` (512) lookups, clamped to [``lookup_timeout_s``, ``lookup_timeout_max_s``]
(5-50 ms by default; a lookup on loopback Redis takes ~0.3 ms, but a busy machine's
scheduling stalls made a fixed 5 ms fire spuriously). A timed-out lookup counts as a
sample of the timeout itself, so a primary that really got slower raises the bound.
Locality is a hint: a stale or partial view costs cache hits, never correctness, so no
call ever raises because of the primary.

An error (refused, reset) opens the circuit at once; timeouts open it after
``trip_after`` (3) in a row, since one slow answer on a busy host is not an outage and
each open circuit sends lookups to the local view, which misses other routers' records.
While open, the primary is skipped entirely (no timeout paid per request) until a
backoff expires: ``backoff_initial_s`` (0.5 s), doubling per consecutive failure up to
``backoff_max_s`` (30 s). The first call after that probes it; a success closes the
circuit and resets the backoff (redis-py reconnects on that call). Beside that, while the
circuit is open an active probe (``warm()``: PING and the scripts) runs every
``probe_interval_s`` (0.25 s), so a returning Redis is used again within about that,
not after a backoff of up to 30 s. ``degraded`` says whether the circuit is open
(exported as ``lmroute_index_degraded``); each change is logged. Records made while
the primary was skipped live only in local memory: after a Redis restart the shared view
starts cold, which is honest.

Errors are counted in ``errors`` (a ``Counter``) by kind, ``lookup_timeout``,
``lookup_error``, ``record_timeout``, ``record_error``, ``evict_error``, ``forget_error``, and reported
through the injected ``on_error(kind)`` (metrics.py plugs in there). ``clock`` (monotonic
seconds) drives the backoff and is injected so tests control it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence

from policies.base import ReplicaId, Residency, Tier
from router.index.base import BlockKey, IndexUnavailable, PrefixIndex, check_record

log = logging.getLogger("lmroute.index")


class LookupTimeout:
    """``multiple`` x the p99 of the last ``window`` lookup times, within [floor, ceiling]."""

    def __init__(self, floor_s: float, ceiling_s: float, multiple: float = 4.0,
                 window: int = 512) -> None:
        self.floor_s = floor_s
        self.ceiling_s = max(ceiling_s, floor_s)
        self.multiple = multiple
        self._samples: deque[float] = deque(maxlen=window)
        self._since_update = 0
        self.value_s = floor_s

    def observe(self, seconds: float) -> None:
        self._samples.append(seconds)
        self._since_update += 1
        if self._since_update >= 32:  # re-sorting the window on every lookup costs too much
            self._since_update = 0
            ordered = sorted(self._samples)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            self.value_s = min(self.ceiling_s, max(self.floor_s, self.multiple * p99))


class ResilientIndex:
    """``PrefixIndex`` over a primary with a local fallback and a backoff circuit."""

    def __init__(
        self,
        primary: PrefixIndex,
        fallback: PrefixIndex,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_error: Callable[[str], None] | None = None,
        lookup_timeout_s: float = 0.005,
        lookup_timeout_max_s: float = 0.05,
        probe_interval_s: float = 0.25,
        write_timeout_s: float = 0.05,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        trip_after: int = 3,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.errors: Counter[str] = Counter()
        self._clock = clock
        self._on_error = on_error
        self.lookup_timeout = LookupTimeout(lookup_timeout_s, lookup_timeout_max_s)
        self._probe_interval_s = probe_interval_s
        self._probe: asyncio.Task[None] | None = None
        self._write_timeout_s = write_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._backoff_s = backoff_initial_s
        self._retry_at: float | None = None
        self._trip_after = trip_after
        self._slow = 0

    @property
    def degraded(self) -> bool:
        """True while the last call to the primary failed (answers come from memory)."""
        return self._retry_at is not None

    def _primary_open(self) -> bool:
        return self._retry_at is None or self._clock() >= self._retry_at

    def _failed(self, kind: str) -> None:
        self.errors[kind] += 1
        if self._on_error is not None:
            self._on_error(kind)
        if kind.endswith("_timeout"):
            self._slow += 1
            if self._slow < self._trip_after:
                return
        self._slow = 0
        if self._retry_at is not None:
            self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)
        else:
            log.warning("index degraded (%s): lookups answered from local memory", kind)
            self._start_probe()
        self._retry_at = self._clock() + self._backoff_s

    def _succeeded(self) -> None:
        self._slow = 0
        if self._retry_at is not None:
            log.warning("index back: the shared index answers again")
        self._retry_at = None
        self._backoff_s = self._backoff_initial_s

    def _start_probe(self) -> None:
        if self._probe_interval_s > 0 and self._probe is None:
            self._probe = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _probe_loop(self) -> None:
        """While degraded, ask the primary every ``probe_interval_s``; close on an answer."""
        try:
            while self._retry_at is not None:
                await asyncio.sleep(self._probe_interval_s)
                try:
                    async with asyncio.timeout(max(0.25, self._write_timeout_s)):
                        await self.primary.warm()
                except (TimeoutError, IndexUnavailable):
                    continue
                self._succeeded()
        finally:
            self._probe = None

    async def lookup(self, chain: Sequence[BlockKey]) -> Residency:
        if chain and self._primary_open():
            timeout_s = self.lookup_timeout.value_s
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s):
                    residency = await self.primary.lookup(chain)
            except TimeoutError:
                self.lookup_timeout.observe(timeout_s)
                self._failed("lookup_timeout")
            except IndexUnavailable:
                self._failed("lookup_error")
            else:
                self.lookup_timeout.observe(time.perf_counter() - t0)
                self._succeeded()
                return residency
        return await self.fallback.lookup(chain)

    async def record(
        self, chain: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        check_record(tier, replica)  # a caller's mistake still raises, here, at once
        await self.fallback.record(chain, tier, replica)
        if chain and self._primary_open():
            try:
                async with asyncio.timeout(self._write_timeout_s):
                    await self.primary.record(chain, tier, replica)
            except TimeoutError:
                self._failed("record_timeout")
            except IndexUnavailable:
                self._failed("record_error")
            else:
                self._succeeded()

    async def evict(
        self, keys: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        check_record(tier, replica)
        await self.fallback.evict(keys, tier, replica)
        # Like forget: a stale "held" belief attracts traffic to a miss, so it is tried
        # even while the circuit is open.
        if keys:
            try:
                async with asyncio.timeout(self._write_timeout_s):
                    await self.primary.evict(keys, tier, replica)
            except (TimeoutError, IndexUnavailable):
                self._failed("evict_error")
            else:
                self._succeeded()

    async def forget(self, replica: ReplicaId) -> None:
        await self.fallback.forget(replica)
        # A forget matters more than a record (a dead replica must not attract traffic),
        # so it is tried even while the circuit is open.
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await self.primary.forget(replica)
        except (TimeoutError, IndexUnavailable):
            self._failed("forget_error")
        else:
            self._succeeded()

    async def warm(self) -> None:
        """Warm the primary; a failure here opens the circuit like any other."""
        try:
            async with asyncio.timeout(max(1.0, self._write_timeout_s)):
                await self.primary.warm()
        except (TimeoutError, IndexUnavailable):
            self._failed("warm_error")
        else:
            self._succeeded()

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.fallback.close()
        await self.primary.close()
