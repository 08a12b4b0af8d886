"""Sessions parked on each replica, and how many will come back during a request's service.

``locality`` charges a placement the delay it causes to the requests already queued behind
it (its load-aware term, ``q(r)``). A conversation between turns is not queued anywhere,
yet its next turn is bound to its replica (that replica holds its history): a long
prefill placed there now delays every such turn that arrives before it ends. Tool-use
agents come back within seconds, so a new agent's 40k-token start, or a session moved
there to recompute its history, makes the replica's other agents wait; the hash and the
queues do not see it (the gauntlet's ``agents`` without a pool at half the knee: p90 TTFT
1.16x the best other policy's over 16 seeds, docs/locality.md).

A session is *parked* on a replica from the end of its reply (no request of it in flight)
until its next request is dispatched; each return teaches the mean gap ``g`` between a
reply's end and the next turn (moving average, ``alpha``) and the share of parked sessions
that come back at all (``p``; a session parked longer than ``horizon x g`` counts as
gone). During a service of ``s`` seconds, each of the ``n`` sessions parked on the
replica arrives with probability about ``p * min(1, s / g)`` and then waits ``s / 2`` on
average, so the charge (``Locality``) is

    weight * expected(r, s) * s / 2,    expected(r, s) = n(r) * p * min(1, s / g)

(``n`` without the request's own session). Before any session has come back there is no
``g``, and no charge: requests that are each their own session (completions without a
session id) never teach one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import Residency


@dataclass(slots=True)
class Returning:
    """Parked sessions per replica (oldest first), the learned gap and return share.
    ``alpha``: the moving averages' weight of a new observation; ``horizon``: a session
    parked longer than this many mean gaps is gone (``max_idle_s`` before any came back);
    ``max_sessions``: at most this many parked sessions per replica (the oldest go
    first)."""

    alpha: float = 0.1
    horizon: float = 3.0
    max_idle_s: float = 600.0
    max_sessions: int = 20_000
    gap: float = 0.0  # mean seconds from a reply's end to the session's next request
    share: float = 1.0  # of parked sessions, the share that came back
    _parked: dict[str, dict[str, float]] = field(default_factory=dict)  # replica -> session
    _where: dict[str, str] = field(default_factory=dict)  # session -> its replica

    def ended(self, session: str, replica: str, residency: Residency, at: float) -> None:
        """``session``'s reply on ``replica`` ended at ``at``, none of it in flight now: it
        is parked there if bound there, i.e. no other replica held half its prompt's chain
        when it was sent (``residency``; another could serve its next turn without
        recomputing most of it)."""
        elsewhere = max((b for r, b in residency.gpu.items() if r != replica), default=0)
        if 2 * elsewhere >= residency.chain_blocks > 0:
            self.forget(session)
        else:
            self.park(session, replica, at)

    def park(self, session: str, replica: str, at: float) -> None:
        """``session``'s reply on ``replica`` ended at ``at`` with none of it in flight."""
        old = self._where.get(session)
        if old is not None:
            del self._parked[old][session]
        parked = self._parked.setdefault(replica, {})
        parked[session] = at
        self._where[session] = replica
        if len(parked) > self.max_sessions:
            gone = next(iter(parked))
            del parked[gone], self._where[gone]

    def forget(self, session: str) -> None:
        """``session`` is not bound to a replica: it is not parked."""
        replica = self._where.pop(session, None)
        if replica is not None:
            del self._parked[replica][session]

    def returned(self, session: str, at: float) -> None:
        """A request of ``session`` is dispatched at ``at``: it is no longer parked."""
        replica = self._where.pop(session, None)
        if replica is None:
            return
        gap = at - self._parked[replica].pop(session)
        self.gap = gap if self.gap <= 0 else self.gap + self.alpha * (gap - self.gap)
        self.share += self.alpha * (1.0 - self.share)

    def expire(self, now: float) -> None:
        """Forget sessions parked longer than ``horizon`` mean gaps: they are gone."""
        if not self._where:  # no session parked: nothing to expire (it runs every dispatch)
            return
        oldest = now - (self.horizon * self.gap if self.gap > 0 else self.max_idle_s)
        for parked in self._parked.values():
            while parked:
                session, at = next(iter(parked.items()))
                if at >= oldest:
                    break
                del parked[session], self._where[session]
                self.share -= self.alpha * self.share

    def expected(self, replica: str, service_s: float, session: str) -> float:
        """Parked sessions of ``replica`` (not ``session``) expected to arrive during a
        service of ``service_s`` seconds there."""
        if self.gap <= 0:
            return 0.0
        parked = self._parked.get(replica)
        if not parked:
            return 0.0
        n = len(parked) - (session in parked)
        return n * self.share * min(1.0, service_s / self.gap)

    def counts(self) -> dict[str, int]:
        return {r: len(p) for r, p in self._parked.items()}

    def as_json(self) -> dict[str, object]:
        """What ``GET /policy`` shows: the learnt gap and share, sessions parked per replica."""
        return {"gap_s": self.gap, "share": self.share, "parked": self.counts()}
