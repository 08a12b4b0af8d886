"""affinity_window: SGLang PR 32195, cache affinity kept inside the near-min-load window."""

from __future__ import annotations

import json

import pytest
from policy_views import replicas, request

from policies.affinity_window import AffinityWindow, AffinityWindowConfig, match_rate
from policies.base import NoReplicaAvailable, Policy, ReplicaView, Residency


def test_is_a_policy_with_sglang_gateway_defaults() -> None:
    policy = AffinityWindow()
    assert isinstance(policy, Policy)
    assert policy.name == "affinity_window"
    assert policy.config == AffinityWindowConfig(64.0, 1.5, 0.3, False)


@pytest.mark.parametrize("kwargs", [
    {"balance_abs_threshold": -1.0},
    {"balance_abs_threshold": float("inf")},
    {"balance_rel_threshold": 0.99},
    {"balance_rel_threshold": float("nan")},
    {"cache_threshold": -0.1},
    {"cache_threshold": 1.0},
])
def test_config_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AffinityWindowConfig(**kwargs)


def test_affinity_wins_when_loads_are_even() -> None:
    decision = AffinityWindow().choose(request({"r0": 2, "r1": 7}), replicas(5, 5, 5))
    assert (decision.replica, decision.reason) == ("r1", "gpu-hit")


def test_balanced_affinity_tolerates_load_below_the_imbalance_gate() -> None:
    # 60 apart is inside the 64 absolute threshold: the holder keeps the request.
    decision = AffinityWindow().choose(request({"r0": 9}), replicas(60, 0))
    assert (decision.replica, decision.reason) == ("r0", "gpu-hit")


def test_match_at_or_below_cache_threshold_is_a_miss_to_the_least_loaded() -> None:
    policy = AffinityWindow()
    # 3 of 10 blocks = 0.3, not above the 0.3 threshold.
    assert policy.choose(request({"r0": 3}), replicas(4, 1)).reason == "miss"
    assert policy.choose(request({"r0": 3}), replicas(4, 1)).replica == "r1"
    # 4 of 10 = 0.4: a hit, despite the load.
    assert policy.choose(request({"r0": 4}), replicas(4, 1)).replica == "r0"


def test_imbalance_keeps_the_prefix_holder_inside_the_window() -> None:
    # min 0, max 100: imbalanced. Window is load <= 64: r1 (40) holds the prefix, r0 does not.
    decision = AffinityWindow().choose(request({"r1": 6}), replicas(0, 40, 100))
    assert (decision.replica, decision.reason) == ("r1", "window-hit")


def test_imbalance_pushes_away_from_an_overloaded_holder() -> None:
    # The holder r2 sits at 100, outside the window (<= 0 + 64): least loaded wins.
    decision = AffinityWindow().choose(request({"r2": 10}), replicas(0, 30, 100))
    assert (decision.replica, decision.reason) == ("r0", "balance")


def test_window_prefers_longest_match_then_lighter_load() -> None:
    policy = AffinityWindow()
    fleet = replicas(0, 50, 60, 200)
    # r3 holds most but is out of the window; r2 holds more than r1.
    assert policy.choose(request({"r1": 3, "r2": 5, "r3": 10}), fleet).replica == "r2"
    # Equal matches in the window: the lighter one sheds load.
    assert policy.choose(request({"r1": 5, "r2": 5}), fleet).replica == "r1"


def test_window_uses_any_match_without_cache_threshold() -> None:
    # One block (10%) is below cache_threshold but still counts inside the window.
    decision = AffinityWindow().choose(request({"r1": 1}), replicas(0, 10, 100))
    assert (decision.replica, decision.reason) == ("r1", "window-hit")


def test_imbalance_needs_both_thresholds() -> None:
    policy = AffinityWindow()
    # 100 apart (beyond 64) but 300 is not above 200 * 1.5: balanced, the holder keeps it.
    assert policy.choose(request({"r0": 9}), replicas(300, 200)).reason == "gpu-hit"
    # 310 > 300: imbalanced, and the holder is outside the window (> 200 + 64).
    decision = policy.choose(request({"r0": 9}), replicas(310, 200))
    assert (decision.replica, decision.reason) == ("r1", "balance")
    # A tighter relative gate opens at 300 vs 200.
    tight = AffinityWindow(AffinityWindowConfig(balance_rel_threshold=1.2))
    assert tight.choose(request({"r0": 9}), replicas(300, 200)).reason == "balance"
    # A wider absolute gate keeps 110 apart balanced.
    wide = AffinityWindow(AffinityWindowConfig(balance_abs_threshold=200.0))
    assert wide.choose(request({"r0": 9}), replicas(310, 200)).reason == "gpu-hit"


def test_window_width_is_the_absolute_threshold() -> None:
    # min 100, max 300: imbalanced. The holder at 164 is inside (<= 164), at 165 outside.
    assert AffinityWindow().choose(request({"r0": 9}), replicas(164, 100, 300)).reason == \
        "window-hit"
    assert AffinityWindow().choose(request({"r0": 9}), replicas(165, 100, 300)).reason == \
        "balance"


def test_load_is_in_flight_unless_engine_queue_is_counted() -> None:
    fleet = [
        ReplicaView(id="r0", url="u0", in_flight=1, waiting=100.0),
        ReplicaView(id="r1", url="u1", in_flight=2),
    ]
    # The router's own in-flight counts are even: the holder wins.
    assert AffinityWindow().choose(request({"r0": 9}), fleet).replica == "r0"
    counted = AffinityWindow(AffinityWindowConfig(count_engine_queue=True))
    decision = counted.choose(request({"r0": 9}), fleet)
    assert (decision.replica, decision.reason) == ("r1", "balance")


def test_unhealthy_and_excluded_replicas_are_never_chosen() -> None:
    policy = AffinityWindow()
    fleet = replicas(0, 0, 0, 200)
    fleet[1] = ReplicaView(id="r1", url="http://r1", healthy=False)
    # r1 (unhealthy) and r2 (excluded) hold the prefix; r3's load must not open a window
    # that lets them in, and the answer is r0.
    gpu = {"r1": 9, "r2": 9}
    decision = policy.choose(request(gpu, exclude=frozenset({"r2"})), fleet)
    assert decision.replica == "r0"
    for i in range(32):
        chosen = policy.choose(request(gpu, session=f"s{i}", exclude=frozenset({"r2"})), fleet)
        assert chosen.replica in {"r0", "r3"}
    with pytest.raises(NoReplicaAvailable):
        policy.choose(request(exclude=frozenset({"r0", "r2", "r3"})), fleet)


def test_unhealthy_replica_load_does_not_trigger_imbalance() -> None:
    fleet = replicas(0, 10)
    fleet.append(ReplicaView(id="r2", url="http://r2", healthy=False, in_flight=500))
    assert AffinityWindow().choose(request({"r1": 9}), fleet).reason == "gpu-hit"


def test_idle_ties_spread_sessions_and_stay_stable_per_session() -> None:
    policy = AffinityWindow()
    fleet = replicas(0, 0, 0, 0)
    chosen = {policy.choose(request(session=f"s{i}"), fleet).replica for i in range(64)}
    assert chosen == {"r0", "r1", "r2", "r3"}
    first = policy.choose(request(session="same"), fleet)
    assert all(policy.choose(request(session="same"), fleet) == first for _ in range(5))
    # Order of the replica list does not matter.
    assert policy.choose(request(session="same"), list(reversed(fleet))) == first


def test_window_match_ties_spread_by_session() -> None:
    policy = AffinityWindow()
    fleet = replicas(10, 10, 200)
    gpu = {"r0": 5, "r1": 5}
    chosen = {policy.choose(request(gpu, session=f"s{i}"), fleet).replica for i in range(64)}
    assert chosen == {"r0", "r1"}


def test_match_rate_clamps_and_falls_back_to_chain() -> None:
    residency = Residency(chain_blocks=4, block_tokens=256, gpu={"a": 4, "b": 1})
    assert match_rate(residency, "a", 900) == 1.0  # 1024 matched tokens > 900 prompt tokens
    assert match_rate(residency, "b", 1024) == 0.25
    assert match_rate(residency, "b", 0) == 0.25
    assert match_rate(residency, "c", 1024) == 0.0


def test_describe_reports_config_and_load_signal() -> None:
    policy = AffinityWindow(AffinityWindowConfig(balance_abs_threshold=8.0))
    described = policy.describe()
    json.dumps(described)
    assert described["name"] == "affinity_window"
    assert described["config"] == {"balance_abs_threshold": 8.0, "balance_rel_threshold": 1.5,
                                   "cache_threshold": 0.3, "count_engine_queue": False}
    assert described["load"] == "in_flight"
    assert "32195" in described["peer"]
