"""``SessionLog``: where a policy last sent each session, and the prompt still in flight.

Used by ``policies.locality`` (its "own dispatch log"); the class docstring says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SessionLog:
    """Where this policy last sent each session, and the prompt still in flight there.

    The router's own view lags: it records a session's replica and prefix only when a
    reply ends, and near saturation that is a whole queueing delay after the decision. A
    session's next turn, arriving meanwhile, would look cold and new, be placed by load
    alone and recompute its history elsewhere: more work exactly when the fleet is
    short of it. So the policy remembers its own dispatches (bounded LRU of
    ``max_sessions``), and counts the prompt of a session's in-flight request as cached
    on its replica (FIFO: it will be computed before anything queued after it)."""

    max_sessions: int = 200_000
    last: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # replica, tokens, id

    def sent(self, session: str, replica: str, tokens: int, request_id: str) -> None:
        self.last.pop(session, None)
        self.last[session] = (replica, tokens, request_id)
        if len(self.last) > self.max_sessions:
            del self.last[next(iter(self.last))]

    def finished(self, session: str, request_id: str) -> None:
        entry = self.last.get(session)
        if entry is not None and entry[2] == request_id:
            self.last[session] = (entry[0], 0, request_id)  # the index knows it from now on

    def replica(self, session: str) -> str | None:
        entry = self.last.get(session)
        return entry[0] if entry is not None else None

    def coming(self, session: str, replica: str) -> int:
        entry = self.last.get(session)
        return entry[1] if entry is not None and entry[0] == replica else 0
