"""The event loop: time order, FIFO at equal times, causality, ``until``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from sim.des.loop import EventInPast, EventLoop


@dataclass
class Note:
    time: float
    name: str
    log: list[tuple[float, str]]
    then: list[Note] = field(default_factory=list)

    def handle(self, now: float) -> Iterable[Note]:
        self.log.append((now, self.name))
        return self.then


def test_events_run_in_time_order_and_fifo_at_equal_times() -> None:
    log: list[tuple[float, str]] = []
    loop = EventLoop()
    loop.schedule([Note(2.0, "c", log), Note(1.0, "a", log), Note(1.0, "b", log)])
    assert loop.run() == 2.0
    assert log == [(1.0, "a"), (1.0, "b"), (2.0, "c")]
    assert loop.handled == 3


def test_handlers_schedule_follow_ups_and_the_clock_follows() -> None:
    log: list[tuple[float, str]] = []
    loop = EventLoop(start=10.0)
    loop.schedule([Note(10.5, "first", log, [Note(12.0, "second", log), Note(11.0, "mid", log)])])
    loop.run()
    assert [name for _, name in log] == ["first", "mid", "second"]
    assert loop.now == 12.0


def test_an_event_in_the_past_is_refused() -> None:
    log: list[tuple[float, str]] = []
    loop = EventLoop()
    loop.schedule([Note(5.0, "late", log, [Note(4.0, "earlier", log)])])
    with pytest.raises(EventInPast):
        loop.run()


def test_until_stops_before_later_events() -> None:
    log: list[tuple[float, str]] = []
    loop = EventLoop()
    loop.schedule([Note(1.0, "a", log), Note(3.0, "b", log)])
    loop.run(until=2.0)
    assert log == [(1.0, "a")] and len(loop) == 1
    loop.run()
    assert log[-1] == (3.0, "b")
