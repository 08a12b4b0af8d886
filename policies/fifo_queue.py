"""A replica's queue of requests before their first token, and the FIFO walk over it.

``policies.locality`` predicts a request's wait on a replica as where this walk ends: one
prefill at a time, each request starting when the one before it ends or when it was sent,
as vLLM schedules long prefills.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Walk = tuple[float, float]  # x -> max(x + B, A): (B, A)
NO_WALK: Walk = (0.0, float("-inf"))  # the identity map


def then(first: Walk, second: Walk) -> Walk:
    """The walk through ``first``'s requests, then ``second``'s (the maps composed)."""
    return first[0] + second[0], max(first[1] + second[0], second[1])


@dataclass(slots=True)
class FifoQueue:
    """A policy's requests on one replica still before their first token, FIFO.

    Each request is a map ``x -> max(x, sent) + service`` (it starts when the one before it
    ends, or when it was sent) = ``x -> max(x + B, A)``, ``B`` its service, ``A`` where it
    ends whatever the walk started from; maps compose to maps of the same form
    (``then``). ``wait`` needs the walk behind the head, and requests join at the back and
    mostly leave at the head, so the queue is two stacks (the sliding-window aggregate):
    ``_back``, joined since, with its whole walk; ``_front``, oldest last, each entry with
    its walk through the newest entry of ``_front``. Join and leave at the head are O(1);
    ``_front`` runs dry once per pass of the queue and is refilled from ``pending`` in
    O(queued). A request leaving out of order (a batched engine's first tokens come
    near the head, in any order) costs the walks of the requests older than it in
    ``_front``, or a refold of ``_back``. ``wait`` is O(1) at every decision, not
    O(queued) as when the walk was refolded after every leave.
    """

    pending: dict[str, tuple[float, float]] = field(default_factory=dict)  # id -> (sent, s)
    last_first_token: float = float("-inf")
    _front: list[tuple[str, Walk]] = field(default_factory=list)
    _back: list[str] = field(default_factory=list)
    _back_walk: Walk = NO_WALK
    # ``wait``'s parts that only a push, a pop or a new last first token change:
    # (last_first_token, the head's end if it started on time, the walk behind it)
    _cached: tuple[float, float, Walk] | None = None

    def push(self, request_id: str, sent: float, service: float) -> None:
        self.pending[request_id] = (sent, service)
        self._cached = None
        self._back.append(request_id)
        # ``then(self._back_walk, (service, sent + service))``, inline: every dispatch
        b, a = self._back_walk
        a += service
        end = sent + service
        self._back_walk = (b + service, a if a > end else end)

    def pop(self, request_id: str, default: tuple[float, float]) -> tuple[float, float]:
        entry = self.pending.pop(request_id, None)
        if entry is None:
            return default
        self._cached = None
        front = self._front
        if front and front[-1][0] == request_id:
            front.pop()
            return entry
        # Out of order: found from the head end, where a batched engine's first tokens are.
        for k in range(len(front) - 2, -1, -1):
            if front[k][0] == request_id:
                del front[k]
                self._rewalk(k)
                return entry
        self._back.remove(request_id)
        b, a = NO_WALK
        pending = self.pending
        for rid in self._back:  # ``then(walk, (service, sent + service))``, inline
            sent, service = pending[rid]
            a += service
            end = sent + service
            b, a = b + service, (a if a > end else end)
        self._back_walk = (b, a)
        return entry

    def _rewalk(self, k: int) -> None:
        """The walks of ``_front[k:]`` (older than a request that left, or all), again."""
        front, pending = self._front, self.pending
        b, a = front[k - 1][1] if k else NO_WALK
        for i in range(k, len(front)):
            # ``then((service, sent + service), walk)``, inline: one per request older
            rid = front[i][0]
            sent, service = pending[rid]
            end = sent + service + b
            b += service
            if a < end:
                a = end
            front[i] = (rid, (b, a))

    def _refill(self) -> None:
        """Every pending request into ``_front``, newest first, each with its walk."""
        self._front = [(rid, NO_WALK) for rid in reversed(self.pending)]
        self._back, self._back_walk = [], NO_WALK
        self._rewalk(0)

    def wait(self, now: float) -> float:
        if not self.pending:
            return max(0.0, self.last_first_token - now)
        cached = self._cached
        if cached is None or cached[0] != self.last_first_token:
            if not self._front:
                self._refill()
            front = self._front
            sent, service = self.pending[front[-1][0]]
            behind = then(front[-2][1], self._back_walk) if len(front) > 1 else self._back_walk
            cached = self._cached = (self.last_first_token,
                                     max(self.last_first_token, sent) + service, behind)
        _, head_end, (total, floor) = cached
        # An overdue head is assumed about to finish.
        return max(0.0, max(max(head_end, now) + total, floor) - now)
