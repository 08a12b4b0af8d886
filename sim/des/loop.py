"""The discrete-event loop: pop the earliest event, set the clock, handle it, push what it returns.

Algorithm (Vidur's shape): a binary heap of ``(time, seq, event)``. ``seq`` is a per-loop
counter, so events at equal times run in the order they were scheduled (FIFO) and the
heap never compares two events. ``run`` pops events until the heap is empty (or the next
one lies beyond ``until``); each event's ``handle(now)`` returns the events it causes,
which must not lie in the past. Virtual time only: nothing here reads a wall clock, and
the loop holds no randomness (generators get an injected ``random.Random``).

Parameters: ``start`` (the clock's initial value, seconds; a study block continues where
the previous workload on the same cluster ended).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from typing import Protocol


class Event(Protocol):
    """Something that happens at ``time`` and may cause further events."""

    @property
    def time(self) -> float: ...

    def handle(self, now: float) -> Iterable[Event]: ...


class EventInPast(ValueError):
    """A handler scheduled an event before the current time (a causality bug)."""


class EventLoop:
    """A heap of pending events and a virtual clock."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, Event]] = []
        self._seq = itertools.count()
        self.handled = 0  # events handled since construction

    @property
    def now(self) -> float:
        """The virtual clock: the time of the event being (or last) handled."""
        return self._now

    def clock(self) -> float:
        """``now`` as a callable, for components that take an injected clock."""
        return self._now

    def __len__(self) -> int:
        return len(self._heap)

    def schedule(self, events: Iterable[Event]) -> None:
        """Push events; each must not lie before ``now``."""
        heap = self._heap
        for event in events:
            t = event.time
            if t < self._now:
                raise EventInPast(f"event at {t} scheduled at {self._now}")
            heapq.heappush(heap, (t, next(self._seq), event))

    def run(self, until: float | None = None) -> float:
        """Handle events in time order until none is left (or the next lies after ``until``).

        Returns the clock at the end: the time of the last event handled.
        """
        heap = self._heap
        pop = heapq.heappop
        while heap:
            if until is not None and heap[0][0] > until:
                break
            t, _, event = pop(heap)
            self._now = t
            self.handled += 1
            self.schedule(event.handle(t))
        return self._now
