"""load_aware: production-stack PR 1035, matched fraction minus beta times relative load."""

from __future__ import annotations

import json

import pytest
from policy_views import replicas, request

from policies.base import NoReplicaAvailable, Policy, ReplicaView
from policies.load_aware import LoadAware, LoadAwareConfig


def test_is_a_policy_with_production_stack_default_beta() -> None:
    policy = LoadAware()
    assert isinstance(policy, Policy)
    assert policy.name == "load_aware"
    assert policy.config == LoadAwareConfig(beta=1.0, hash_on_miss=True, count_engine_queue=False)


@pytest.mark.parametrize("beta", [-0.1, float("inf"), float("nan")])
def test_config_validation(beta: float) -> None:
    with pytest.raises(ValueError):
        LoadAwareConfig(beta=beta)


def test_affinity_wins_when_loads_are_even() -> None:
    decision = LoadAware().choose(request({"r0": 2, "r1": 7}), replicas(4, 4, 4))
    assert (decision.replica, decision.reason) == ("r1", "score")


def test_score_is_matched_fraction_minus_beta_relative_load() -> None:
    policy = LoadAware()
    # Mean load 4: relative loads +1, -0.5, -0.5.
    scores = policy.scores(request({"r0": 10, "r1": 4}), replicas(8, 2, 2))
    assert scores == pytest.approx({"r0": 1.0 - 1.0, "r1": 0.4 + 0.5, "r2": 0.0 + 0.5})


def test_beta_pushes_away_from_an_overloaded_holder() -> None:
    fleet = replicas(8, 2, 2)
    req = request({"r0": 10})
    # Default beta: r0 at twice the mean forfeits its full hit; r1/r2 score 0.5 > 0.
    assert LoadAware().choose(req, fleet).replica in {"r1", "r2"}
    # beta 0 is pure affinity.
    assert LoadAware(LoadAwareConfig(beta=0.0)).choose(req, fleet).replica == "r0"
    # A small beta keeps the hit: 1 - 0.4 * 1 > 0 + 0.4 * 0.5.
    assert LoadAware(LoadAwareConfig(beta=0.4)).choose(req, fleet).replica == "r0"


def test_two_replica_crossover_is_half_a_mean_at_default_beta() -> None:
    # Two replicas, full hit on r0: r0 keeps it while relative load r < 0.5.
    policy = LoadAware()
    assert policy.choose(request({"r0": 10}), replicas(14, 6)).replica == "r0"  # r = 0.4
    assert policy.choose(request({"r0": 10}), replicas(16, 4)).replica == "r1"  # r = 0.6


def test_idle_fleet_is_quiet_because_the_mean_is_clamped_at_one() -> None:
    # Mean 0.25 is clamped to 1: one in-flight request is +0.75, not +3.0 (300% over).
    rel = LoadAware().relative_loads(replicas(1, 0, 0, 0))
    assert rel == pytest.approx({"r0": 0.75, "r1": -0.25, "r2": -0.25, "r3": -0.25})
    # So at beta 0.5 a full hit survives one stray request (1 - 0.375 > 0.125); unclamped
    # it would lose (1 - 1.5 < 0.5).
    policy = LoadAware(LoadAwareConfig(beta=0.5))
    assert policy.choose(request({"r0": 10}), replicas(1, 0, 0, 0)).replica == "r0"


def test_match_beyond_the_prompt_is_clamped_to_a_full_hit() -> None:
    policy = LoadAware(LoadAwareConfig(beta=0.0))
    # r0 matches 1000 tokens of a 900-token prompt, r1 exactly 900 worth (9 blocks):
    # both are full hits and tie, not r0 ahead.
    scores = policy.scores(request({"r0": 10, "r1": 9}, prompt_tokens=900), replicas(0, 0))
    assert scores["r0"] == scores["r1"] == 1.0


def test_unknown_prompt_size_uses_the_chain() -> None:
    scores = LoadAware().scores(request({"r0": 5}, prompt_tokens=0), replicas(0, 0))
    assert scores["r0"] == pytest.approx(0.5)


def test_miss_hashes_the_session_by_default_and_scores_when_told() -> None:
    fleet = replicas(50, 0, 0, 0)
    hashed = {LoadAware().choose(request(session=f"s{i}"), fleet).replica for i in range(64)}
    assert hashed == {"r0", "r1", "r2", "r3"}  # the peer's miss route ignores load
    assert LoadAware().choose(request(), fleet).reason == "miss"
    scored = LoadAware(LoadAwareConfig(hash_on_miss=False))
    chosen = {scored.choose(request(session=f"s{i}"), fleet).replica for i in range(64)}
    assert chosen == {"r1", "r2", "r3"}  # least relative load, ties spread by session
    assert scored.choose(request(), fleet).reason == "score"


def test_load_is_in_flight_unless_engine_queue_is_counted() -> None:
    fleet = [
        ReplicaView(id="r0", url="u0", in_flight=2, waiting=30.0),
        ReplicaView(id="r1", url="u1", in_flight=2),
    ]
    assert LoadAware().choose(request({"r0": 10}), fleet).replica == "r0"
    counted = LoadAware(LoadAwareConfig(count_engine_queue=True))
    assert counted.choose(request({"r0": 10}), fleet).replica == "r1"


def test_unhealthy_and_excluded_replicas_are_never_chosen() -> None:
    policy = LoadAware()
    fleet = replicas(3, 0, 0, 3)
    fleet[1] = ReplicaView(id="r1", url="http://r1", healthy=False)
    gpu = {"r1": 10, "r2": 10}
    for i in range(32):
        chosen = policy.choose(request(gpu, session=f"s{i}", exclude=frozenset({"r2"})), fleet)
        assert chosen.replica in {"r0", "r3"}
    with pytest.raises(NoReplicaAvailable):
        policy.choose(request(exclude=frozenset({"r0", "r2", "r3"})), fleet)


def test_mean_is_over_candidates_only() -> None:
    # An unhealthy replica at 100 must not drag the mean up and flatten r0's overload.
    fleet = replicas(8, 0)
    fleet.append(ReplicaView(id="r2", url="http://r2", healthy=False, in_flight=100))
    assert LoadAware().choose(request({"r0": 10}), fleet).replica == "r1"


def test_score_ties_are_deterministic_and_spread_sessions() -> None:
    policy = LoadAware()
    fleet = replicas(2, 2, 2, 2)
    gpu = {f"r{i}": 5 for i in range(4)}
    chosen = {policy.choose(request(gpu, session=f"s{i}"), fleet).replica for i in range(64)}
    assert chosen == {"r0", "r1", "r2", "r3"}
    first = policy.choose(request(gpu, session="same"), fleet)
    assert all(policy.choose(request(gpu, session="same"), fleet) == first for _ in range(5))
    assert policy.choose(request(gpu, session="same"), list(reversed(fleet))) == first


def test_describe_reports_config_and_load_signal() -> None:
    described = LoadAware(LoadAwareConfig(beta=0.25, count_engine_queue=True)).describe()
    json.dumps(described)
    assert described["name"] == "load_aware"
    assert described["config"] == {"beta": 0.25, "hash_on_miss": True, "count_engine_queue": True}
    assert described["load"] == "in_flight + waiting"
    assert "1035" in described["peer"]
