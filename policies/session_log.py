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
    on its replica (FIFO: it will be computed before anything queued after it).

    It also counts each session's requests in flight: a request no longer than one of
    the session's requests still in flight does not continue a conversation (a next turn
    extends its history, so its prompt is longer) but repeats its opening: many clients
    sending the same system prompt and first message without a session id (a batch job,
    an eval sampling one prompt many times, a benchmark). ``repeats`` says so."""

    max_sessions: int = 200_000
    # session -> (its last replica, the tokens of its prompt in flight there or 0, its
    # request id); read directly by ``locality`` once per decision
    last: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    # session -> [its requests in flight, the longest prompt sent since it had none]
    _flying: dict[str, list[int]] = field(default_factory=dict)
    _in_flight: set[str] = field(default_factory=set)  # request ids

    def sent(self, session: str, replica: str, tokens: int, request_id: str) -> None:
        self.last.pop(session, None)
        self.last[session] = (replica, tokens, request_id)
        if len(self.last) > self.max_sessions:
            del self.last[next(iter(self.last))]
        if request_id not in self._in_flight:
            self._in_flight.add(request_id)
            flying = self._flying.setdefault(session, [0, 0])
            flying[0] += 1
            flying[1] = max(flying[1], tokens)

    def repeats(self, session: str, tokens: int) -> bool:
        """Requests of ``session`` are in flight, one at least ``tokens`` long: this one is
        another client's copy of the opening, not the conversation's next turn."""
        flying = self._flying.get(session)
        return flying is not None and tokens <= flying[1]

    def flying(self, session: str) -> bool:
        """Whether a request of ``session`` is in flight."""
        return session in self._flying

    def finished(self, session: str, request_id: str) -> None:
        if request_id in self._in_flight:
            self._in_flight.discard(request_id)
            flying = self._flying[session]
            flying[0] -= 1
            if not flying[0]:
                del self._flying[session]
        entry = self.last.get(session)
        if entry is not None and entry[2] == request_id:
            self.last[session] = (entry[0], 0, request_id)  # the index knows it from now on
