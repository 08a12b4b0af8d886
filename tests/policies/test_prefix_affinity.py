"""prefix_affinity: GPU prefix wins, imbalance falls back to least loaded, misses balance."""

from __future__ import annotations

import pytest

from policies.base import NoReplicaAvailable, Policy, ReplicaView, RequestView, Residency
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig


def replicas(*loads: float) -> list[ReplicaView]:
    return [ReplicaView(id=f"r{i}", url=f"http://r{i}", in_flight=int(x)) for i, x in enumerate(loads)]


def request(
    gpu: dict[str, int] | None = None,
    chain: int = 10,
    session: str = "s",
    exclude: frozenset[str] = frozenset(),
) -> RequestView:
    residency = Residency(chain_blocks=chain, gpu=gpu or {}, pool=chain)
    return RequestView(request_id="q", model="m", session=session, residency=residency, exclude=exclude)


def test_is_a_policy_with_sglang_defaults() -> None:
    policy = PrefixAffinity()
    assert isinstance(policy, Policy)
    assert policy.name == "prefix_affinity"
    assert policy.config == PrefixAffinityConfig(32.0, 1.0001, 0.0)
    with pytest.raises(ValueError):
        PrefixAffinityConfig(balance_rel_threshold=0.5)


def test_longest_gpu_prefix_wins_over_load_when_balanced() -> None:
    decision = PrefixAffinity().choose(request({"r0": 2, "r1": 7}), replicas(0, 20, 1))
    assert (decision.replica, decision.reason) == ("r1", "gpu-hit")


def test_match_ties_go_to_the_less_loaded() -> None:
    decision = PrefixAffinity().choose(request({"r0": 5, "r1": 5}), replicas(3, 1))
    assert (decision.replica, decision.reason) == ("r1", "gpu-hit")


def test_imbalance_needs_both_thresholds() -> None:
    policy = PrefixAffinity()
    # 33 apart and well above 1.0001x: imbalanced -> least loaded, despite r0's match.
    decision = policy.choose(request({"r0": 9}), replicas(40, 7))
    assert (decision.replica, decision.reason) == ("r1", "balance")
    # Exactly 32 apart is not beyond the absolute threshold.
    assert policy.choose(request({"r0": 9}), replicas(39, 7)).reason == "gpu-hit"
    # Far apart in absolute terms but within the relative threshold.
    loose = PrefixAffinity(PrefixAffinityConfig(balance_rel_threshold=2.0))
    assert loose.choose(request({"r0": 9}), replicas(100, 60)).reason == "gpu-hit"
    assert loose.choose(request({"r0": 9}), replicas(130, 60)).reason == "balance"


def test_balance_prefers_the_match_among_equally_light_replicas() -> None:
    decision = PrefixAffinity().choose(request({"r2": 4}), replicas(50, 0, 0))
    assert (decision.replica, decision.reason) == ("r2", "balance")


def test_no_match_goes_to_the_least_loaded() -> None:
    decision = PrefixAffinity().choose(request({}), replicas(5, 2, 9))
    assert (decision.replica, decision.reason) == ("r1", "miss")


def test_cache_threshold_turns_short_matches_into_misses() -> None:
    policy = PrefixAffinity(PrefixAffinityConfig(cache_threshold=0.5))
    assert policy.choose(request({"r0": 5}, chain=10), replicas(0, 0)).reason == "miss"
    assert policy.choose(request({"r0": 6}, chain=10), replicas(3, 0)).replica == "r0"


def test_idle_ties_spread_sessions_and_stay_stable_per_session() -> None:
    policy = PrefixAffinity()
    fleet = replicas(0, 0, 0, 0)
    chosen = {policy.choose(request(session=f"s{i}"), fleet).replica for i in range(64)}
    assert chosen == {"r0", "r1", "r2", "r3"}
    first = policy.choose(request(session="same"), fleet)
    assert all(policy.choose(request(session="same"), fleet) == first for _ in range(5))


def test_unhealthy_and_excluded_replicas_are_never_chosen() -> None:
    policy = PrefixAffinity()
    fleet = replicas(0, 0, 0)
    fleet[1] = ReplicaView(id="r1", url="http://r1", healthy=False)
    decision = policy.choose(request({"r1": 9, "r2": 3}, exclude=frozenset({"r2"})), fleet)
    assert (decision.replica, decision.reason) == ("r0", "miss")
    with pytest.raises(NoReplicaAvailable):
        policy.choose(request(exclude=frozenset({"r0", "r2"})), fleet)


def test_load_counts_engine_waiting_queue() -> None:
    fleet = [
        ReplicaView(id="r0", url="u0", in_flight=1, waiting=40.0),
        ReplicaView(id="r1", url="u1", in_flight=2),
    ]
    decision = PrefixAffinity().choose(request({"r0": 9}), fleet)
    assert (decision.replica, decision.reason) == ("r1", "balance")
