"""The baseline policies as pure objects: the same ones the router and simulator run."""

from __future__ import annotations

import pytest

from policies import registry
from policies.base import Decision, NoReplicaAvailable, ReplicaView, RequestView


def reps(n: int, **load: float) -> list[ReplicaView]:
    return [ReplicaView(id=f"r{i}", url=f"http://r{i}", waiting=load.get(f"r{i}", 0.0))
            for i in range(n)]


def req(session: str = "s", exclude: frozenset[str] = frozenset()) -> RequestView:
    return RequestView(request_id="x", model="m", session=session, exclude=exclude)


def run(policy_name: str, replicas: list[ReplicaView], sessions: list[str]) -> list[str]:
    policy = registry.create(policy_name)
    out = []
    for s in sessions:
        d = policy.choose(req(s), replicas)
        policy.dispatched(req(s), d)
        out.append(d.replica)
    return out


def test_registry_names_and_fresh_instances() -> None:
    assert {"alternating", "fixed", "least_loaded", "round_robin", "prefix_affinity"} <= set(
        registry.names())
    assert registry.create("fixed") is not registry.create("fixed")
    with pytest.raises(registry.UnknownPolicy):
        registry.create("nope")


def test_round_robin_cycles() -> None:
    assert run("round_robin", reps(3), ["a"] * 6) == ["r0", "r1", "r2", "r0", "r1", "r2"]


def test_least_loaded_picks_min_and_rotates_ties() -> None:
    assert set(run("least_loaded", reps(3, r0=5, r1=1, r2=5), ["a"] * 4)) == {"r1"}
    assert run("least_loaded", reps(2), ["a"] * 4) == ["r0", "r1", "r0", "r1"]
    busy = [ReplicaView(id="r0", url="", in_flight=3), ReplicaView(id="r1", url="", waiting=2)]
    assert registry.create("least_loaded").choose(req(), busy).replica == "r1"


def test_fixed_is_sticky_and_moves_only_lost_sessions() -> None:
    sessions = [f"s{i}" for i in range(200)]
    before = run("fixed", reps(4), sessions)
    assert before == run("fixed", reps(4), sessions)
    assert len(set(before)) == 4
    survivors = [r for r in reps(4) if r.id != "r2"]
    after = run("fixed", survivors, sessions)
    for b, a in zip(before, after, strict=True):
        assert a == b or b == "r2"
    unhealthy = [ReplicaView(id=r.id, url=r.url, healthy=r.id != "r2") for r in reps(4)]
    assert run("fixed", unhealthy, sessions) == after


def test_fixed_failover_reason() -> None:
    policy = registry.create("fixed")
    first = policy.choose(req("s1"), reps(3))
    assert first.reason == "sticky"
    second = policy.choose(req("s1", exclude=frozenset({first.replica})), reps(3))
    assert second.replica != first.replica and second.reason == "failover"


def test_alternating_cycles_and_skips_excluded() -> None:
    assert run("alternating", reps(3), ["a"] * 4)[1:] in (
        ["r1", "r2", "r0"], ["r2", "r0", "r1"], ["r0", "r1", "r2"])
    policy = registry.create("alternating")
    policy.dispatched(req("a"), Decision("r0", "first-turn"))
    assert policy.choose(req("a", exclude=frozenset({"r1"})), reps(3)).replica == "r2"


def test_alternating_memory_is_bounded() -> None:
    from policies.alternating import Alternating

    policy = Alternating(max_sessions=10)
    for i in range(100):
        policy.dispatched(req(f"s{i}"), Decision("r0", "first-turn"))
    assert len(policy._last) == 10


@pytest.mark.parametrize("name", ["round_robin", "least_loaded", "fixed", "alternating"])
def test_no_candidate_raises(name: str) -> None:
    down = [ReplicaView(id="r0", url="", healthy=False)]
    with pytest.raises(NoReplicaAvailable):
        registry.create(name).choose(req(), down)
