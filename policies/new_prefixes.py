"""Where ``locality`` places a prompt no replica holds: a new prefix's first reader.

Where a new prefix lands its later readers follow (they hit it there), so the placement
lasts as long as the prefix is read; a queue of the moment is gone in a second. How long
a new prefix is read is learnt from the traffic: ``warm_share``, the share of recent
prompts (of at least one index block) that some replica held, an exponential moving
average with weight ``WARM_ALPHA`` per prompt, starting at 1 (a fleet's first prompts
are new prefixes whatever the workload). A share ``w`` of warm prompts is ``w / (1 - w)``
readers per new prefix (``readers``, at most ``MAX_READERS``): vLLM's
``prefix_repetition`` benchmark (8 prefixes, 480 prompts) about 60; a conversation trace
whose prompts are nine in ten new, about 0.1.

Among the candidates whose scores the cost model cannot tell apart
(``policies.locality``, "Ties"), a new prefix goes to the fewest requests committed:
those queued now plus ``readers`` times the new prefixes placed there lately. Where
prefixes are read many times (the vLLM pair's ``prefix`` at 8 req/s) that spreads them
evenly, where a queue's order or the work placed lately left them 5/3 (75/45 of 120
requests); where they are read about once (``chat``), the queues decide, as for any
other tie: counted before the queues regardless, ``chat`` at the pair's knee was 1.8x
slower on the mean. Then the fewest in flight, then the least predicted service placed
lately.

``NewPrefixes``: for each replica the new prefixes (prompts of a block or more that no
replica held) and the predicted service placed on it lately, each an exponentially
decayed sum with time constant ``time_constant_s``:
``value(now) = value(at) * exp(-(now - at) / time_constant_s)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

WARM_ALPHA = 1 / 32
MAX_READERS = 64.0


@dataclass(slots=True)
class NewPrefixes:
    """New prefixes and predicted service placed on each replica lately (decayed), and
    the share of prompts lately that found their prefix held."""

    time_constant_s: float
    warm_share: float = 1.0
    # replica -> (new prefixes, predicted service, at): the decayed sums as of ``at``
    _sums: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def of(self, replica: str, now: float) -> tuple[float, float]:
        """(new prefixes, predicted service) placed on ``replica``, decayed to ``now``."""
        prefixes, work, at = self._sums.get(replica, (0.0, 0.0, now))
        decay = math.exp(-(now - at) / self.time_constant_s)
        return prefixes * decay, work * decay

    def readers(self) -> float:
        """Expected later readers of a new prefix: ``w / (1 - w)`` of the warm share."""
        w = self.warm_share
        return MAX_READERS if w >= MAX_READERS / (1 + MAX_READERS) else w / (1 - w)

    def committed(self, replica: str, queued: int, now: float) -> float:
        """Requests ``replica`` is committed to: ``queued`` now plus the expected readers
        of the new prefixes placed on it lately."""
        return queued + self.of(replica, now)[0] * self.readers()

    def add(self, replica: str, now: float, *, blocks: int, held: bool, work: float) -> None:
        """Record a dispatch to ``replica`` of a prompt of ``blocks`` index blocks (0: shorter
        than one: a warm-up or a health check, no prefix and no evidence), ``held``: some
        replica or the pool held part of it; ``work``: its predicted service."""
        prefixes, placed = self.of(replica, now)
        new = blocks > 0 and not held
        if blocks > 0:
            self.warm_share += WARM_ALPHA * (float(held) - self.warm_share)
        self._sums[replica] = (prefixes + new, placed + work, now)

    def as_json(self) -> dict[str, Any]:
        """For ``GET /policy``: the warm share, the readers it gives a new prefix, and each
        replica's new prefixes as of its last placement (not decayed to now: no clock)."""
        return {"warm_share": self.warm_share, "readers": self.readers(),
                "placed": {rid: prefixes for rid, (prefixes, _, _) in self._sums.items()}}
