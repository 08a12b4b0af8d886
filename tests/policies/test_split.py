"""The A/B split policy: sticky per session, weighted, delegating, the same on every router."""

from __future__ import annotations

import pytest

from policies import registry
from policies.base import Outcome, ReplicaView, RequestView
from policies.locality import Locality
from policies.round_robin import RoundRobin
from policies.split import Split, SplitSpecError, parse_split

REPLICAS = [ReplicaView(id=f"r{i}", url=f"http://r{i}") for i in range(3)]


def req(session: str, rid: str = "x") -> RequestView:
    return RequestView(request_id=rid, model="m", session=session, prompt_tokens=4096)


def split(spec: str) -> Split:
    policy = registry.create("split", {"spec": spec})
    assert isinstance(policy, Split)
    return policy


def test_parse_compact_and_json_forms_agree() -> None:
    compact = parse_split("A=fixed:50, B=locality@stay_margin=0.3@calibrate=false:50, salt=e7")
    as_json = parse_split('{"salt": "e7", "arms": [{"name": "A", "policy": "fixed", "weight": 50},'
                          '{"name": "B", "policy": "locality", "weight": 50,'
                          ' "options": {"stay_margin": 0.3, "calibrate": false}}]}')
    assert compact == as_json
    built = split("A=fixed:50,B=locality@stay_margin=0.3:50")
    b = built.arms[1].policy
    assert isinstance(b, Locality) and b.config.stay_margin == 0.3


@pytest.mark.parametrize("bad", ["A=fixed:50,A=fixed:50", "A=fixed:-1", "A=fixed:x", "fixed",
                                 "A=nope:1", "A=fixed@x=1:1", "A=locality@nope=1:1", "A=fixed:0"])
def test_bad_specs_fail_at_build_time(bad: str) -> None:
    with pytest.raises((SplitSpecError, registry.BadPolicyOptions, registry.UnknownPolicy)):
        split(bad)


def test_sticky_per_session_and_weighted() -> None:
    policy = split("A=fixed:25,B=fixed:75")
    sessions = [f"s{i}" for i in range(4000)]
    first = {s: policy.choose(req(s), REPLICAS).arm for s in sessions}
    # Every later turn of a session lands in the same arm.
    assert all(policy.choose(req(s), REPLICAS).arm == a for s, a in first.items())
    share_b = sum(a == "B" for a in first.values()) / len(first)
    assert 0.72 < share_b < 0.78  # 75 % +- 3 (binomial sd 0.7 %)


def test_several_routers_agree_and_salt_reshuffles() -> None:
    spec = "A=round_robin:50,B=fixed:50,salt=exp1"
    routers = [split(spec) for _ in range(3)]
    sessions = [f"user-{i}" for i in range(500)]
    arms = [[r.arm_of(s).name for s in sessions] for r in routers]
    assert arms[0] == arms[1] == arms[2]
    other = split("A=round_robin:50,B=fixed:50,salt=exp2")
    moved = sum(a != other.arm_of(s).name for a, s in zip(arms[0], sessions, strict=True))
    assert 180 < moved < 320  # an independent re-draw moves about half


def test_delegates_choose_dispatched_observe_to_the_arm_that_chose() -> None:
    policy = split("A=round_robin:1,B=locality:1")
    rr, loc = policy.arms[0].policy, policy.arms[1].policy
    assert isinstance(rr, RoundRobin) and isinstance(loc, Locality)
    a_sessions = [s for s in (f"s{i}" for i in range(50)) if policy.arm_of(s).name == "A"][:3]
    b_session = next(s for s in (f"t{i}" for i in range(50)) if policy.arm_of(s).name == "B")
    picked = []
    for i, s in enumerate(a_sessions):
        d = policy.choose(req(s, f"a{i}"), REPLICAS)
        assert d.arm == "A" and d.reason == "round-robin"
        policy.dispatched(req(s, f"a{i}"), d)
        picked.append(d.replica)
    assert picked == ["r0", "r1", "r2"]  # the arm's own cursor advanced, once per dispatch
    view = req(b_session, "b0")
    d = policy.choose(view, REPLICAS)
    assert d.arm == "B" and d.predicted_ttft_s is not None
    policy.dispatched(view, d)
    assert loc.describe()["queued"] == {d.replica: 1}
    # A weight change builds a new split over the same arm objects; the request chosen by
    # the old one still observes into the arm policy that chose it.
    swapped = policy.with_weights({"A": 0})
    assert swapped.arms[1].policy is loc
    assert all(swapped.arm_of(s).name == "B" for s in a_sessions)
    policy.observe(Outcome(view, d, ok=True, ttft_s=1.0, total_s=1.0, at=1.0))
    assert loc.describe()["queued"] == {d.replica: 0}
    with pytest.raises(SplitSpecError):
        policy.with_weights({"C": 1})


def test_describe_names_arms_and_their_state() -> None:
    out = split("A=fixed:1,B=locality:3").describe()
    assert [(a["name"], a["policy"], a["weight"]) for a in out["arms"]] == [
        ("A", "fixed", 1.0), ("B", "locality", 3.0)]
    assert out["arms"][1]["state"]["name"] == "locality"
