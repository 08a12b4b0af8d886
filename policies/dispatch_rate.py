"""Requests ``locality`` dispatched to each replica per second lately.

For each replica an exponentially decayed count of dispatches, time constant
``time_constant_s``: ``count(now) = count(at) * exp(-(now - at) / time_constant_s)``, and
the rate is that count over the decay kernel's weight of the time observed since the
first dispatch, ``time_constant_s * (1 - exp(-elapsed / time_constant_s))``: a steady
stream of ``lambda`` a second reads ``lambda`` from its first seconds on, not ``lambda``
times the share of the time constant seen so far.

Used for Little's law: the requests that will arrive at a replica while a placement there
waits and is served, ``rate x (wait + service)`` (``policies.locality``,
``sojourn_arrivals``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class DispatchRate:
    """Dispatches per second to each replica, decayed with ``time_constant_s``."""

    time_constant_s: float
    _start: float | None = None
    _counts: dict[str, tuple[float, float]] = field(default_factory=dict)  # replica -> (count, at)

    def add(self, replica: str, now: float) -> None:
        """Record one dispatch to ``replica`` at ``now``."""
        if self._start is None:
            self._start = now
        self._counts[replica] = (self._count(replica, now) + 1.0, now)

    def _count(self, replica: str, now: float) -> float:
        """``replica``'s decayed count of dispatches as of ``now``."""
        count, at = self._counts.get(replica, (0.0, now))
        return count * math.exp(-(now - at) / self.time_constant_s)

    def rate(self, replica: str, now: float) -> float:
        """Dispatches per second to ``replica`` lately; infinite before any time has passed
        since the first dispatch (no rate can be told yet)."""
        if self._start is None:
            return math.inf
        tau = self.time_constant_s
        window = tau * (1.0 - math.exp(-(now - self._start) / tau))
        if window <= 0:
            return math.inf
        return self._count(replica, now) / window
