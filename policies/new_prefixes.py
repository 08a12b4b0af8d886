"""Where ``locality`` places a prompt no replica holds: a new prefix's first reader.

Where a new prefix lands, its later readers follow (they hit it there), so the placement
lasts; the queues of the moment do not. Among the candidates whose scores the cost model
cannot tell apart (``policies.locality``, "Ties"), a new prefix goes to the fewest new
prefixes placed lately, which spreads them evenly; then, as other ties, to the shortest
queue; then to the least predicted service placed lately. By the work alone, the first
readers' hits and the calibration's first estimates made it noisy: on the vLLM pair 8
shared prefixes landed 5/3 (75/45 of 120 requests); by a hash, 6/2 (90/30).

``RecentPlacements``: for each replica, the new prefixes (prompts of at least one index
block; a warm-up or a health check leaves no prefix to follow) and the predicted service
placed on it lately, each an exponentially decayed sum with time constant
``time_constant_s``: ``value(now) = value(at) * exp(-(now - at) / time_constant_s)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class RecentPlacements:
    """New prefixes and predicted service placed on each replica lately (decayed)."""

    time_constant_s: float
    # replica -> (new prefixes, predicted service, at): the decayed sums as of ``at``
    _sums: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def of(self, replica: str, now: float) -> tuple[float, float]:
        """(new prefixes, predicted service) placed on ``replica``, decayed to ``now``."""
        prefixes, work, at = self._sums.get(replica, (0.0, 0.0, now))
        decay = math.exp(-(now - at) / self.time_constant_s)
        return prefixes * decay, work * decay

    def add(self, replica: str, now: float, *, new_prefix: bool, work: float) -> None:
        """Record a dispatch to ``replica``: ``new_prefix`` (a prompt of a block or more
        that no replica held) and its predicted service ``work``."""
        prefixes, placed = self.of(replica, now)
        self._sums[replica] = (prefixes + new_prefix, placed + work, now)

