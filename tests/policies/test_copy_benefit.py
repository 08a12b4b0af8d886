"""A copy's benefit to a prefix's readers: what it lowers, by how much, and its floor."""

from __future__ import annotations

import pytest

from policies import copy_benefit
from policies.cost import Estimate

# a holds a 32k document behind a 2 s queue; b and c hold none of it, c behind 2.5 s.
HOLDER = Estimate("a", 2.0, 0.0, 0.3, 32_768, 0, 232)
IDLE = Estimate("b", 0.0, 0.0, 5.3, 0, 0, 33_000)
BUSY = Estimate("c", 2.5, 0.0, 5.3, 0, 0, 33_000)
BEFORE = {"a": 2.3, "b": 6.0, "c": 20.0}


def scored(readers: int, *, weight: float = 1.0, mean_service: float = 0.0,
           idle: Estimate = IDLE) -> dict[str, float]:
    scores = dict(BEFORE)
    copy_benefit.apply(scores, {"a": HOLDER, "b": idle, "c": BUSY}, readers, weight=weight,
                       work_weight=1.0, mean_service=mean_service)
    return scores


def test_each_reader_saves_half_the_difference_of_the_waits() -> None:
    # No service time observed yet: no queue counts, nothing divides the benefit.
    assert scored(0) == BEFORE
    assert scored(1)["b"] == pytest.approx(6.0 - 1 * 2.0 / 2)
    assert scored(3)["b"] == pytest.approx(6.0 - 3 * 2.0 / 2)
    assert scored(3, weight=0.5)["b"] == pytest.approx(6.0 - 0.5 * 3 * 2.0 / 2)
    assert scored(3, weight=0.0) == BEFORE


def test_queues_across_the_fleet_shrink_the_benefit() -> None:
    # A mean service of 1 s: the candidates' queues are 2, 0 and 2.5 services, 1.5 on mean.
    assert scored(3, mean_service=1.0)["b"] == pytest.approx(6.0 - 3 * 2.0 / 2 / 2.5)
    # Half the service time: twice the queue counts (mean 3).
    assert scored(3, mean_service=0.5)["b"] == pytest.approx(6.0 - 3 * 2.0 / 2 / 4)


def test_the_holder_and_a_replica_waiting_longer_than_it_gain_nothing() -> None:
    after = scored(50)
    assert after["a"] == BEFORE["a"] and after["c"] == BEFORE["c"]


def test_a_copy_never_scores_below_holding_the_prefix() -> None:
    # b's score as a holder: its wait (0) plus the holder's service (0.3).
    assert scored(1000)["b"] == pytest.approx(0.3)
    # With a 1 s queue on b (one mean service) the floor adds the load-aware charge:
    # 1 + 0.3 x (1 + 1).
    queued = Estimate("b", 1.0, 0.0, 5.3, 0, 0, 33_000)
    assert scored(1000, idle=queued, mean_service=1.0)["b"] == pytest.approx(1.0 + 0.3 * 2)


def test_a_score_already_below_the_floor_is_left_alone() -> None:
    scores = {"a": 2.3, "b": 0.1}
    copy_benefit.apply(scores, {"a": HOLDER, "b": IDLE}, 10, weight=1.0, work_weight=1.0,
                       mean_service=1.0)
    assert scores == {"a": 2.3, "b": 0.1}
