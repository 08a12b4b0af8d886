"""Sessions parked between turns: what ``Returning`` learns, and how ``locality`` uses it."""

from __future__ import annotations

import dataclasses

import pytest

from policies.base import Outcome, ReplicaView, RequestView, Residency
from policies.hashing import rendezvous_rank
from policies.locality import Locality, LocalityConfig
from policies.returning import Returning

BT = 256


def test_no_charge_until_a_session_has_come_back() -> None:
    parked = Returning()
    parked.park("s1", "a", 0.0)
    parked.park("s2", "a", 0.5)
    assert parked.expected("a", 10.0, "new") == 0.0  # no gap learnt: requests may never return
    parked.returned("s1", 2.0)  # back after 2 s
    assert parked.gap == pytest.approx(2.0)
    # s2 is still parked; a 1 s service catches it with probability 1/2, a 4 s one surely.
    assert parked.expected("a", 1.0, "new") == pytest.approx(0.5)
    assert parked.expected("a", 4.0, "new") == pytest.approx(1.0)
    assert parked.expected("a", 4.0, "s2") == 0.0  # a session is not its own returner
    assert parked.expected("b", 4.0, "new") == 0.0


def test_sessions_parked_past_the_horizon_are_gone_and_lower_the_share() -> None:
    parked = Returning(alpha=0.5, horizon=3.0)
    for i in range(3):
        parked.park(f"s{i}", "a", float(i))
    parked.returned("s0", 2.0)  # gap 2 s: gone after 6 s parked
    parked.expire(6.5)  # s1 parked at 1.0 (5.5 s), s2 at 2.0: both still parked
    assert parked.counts() == {"a": 2}
    parked.expire(7.5)  # s1 is past 6 s
    assert parked.counts() == {"a": 1}
    assert parked.share == pytest.approx(0.5)
    assert parked.expected("a", 10.0, "new") == pytest.approx(0.5)


def test_a_session_parks_where_its_last_reply_ended() -> None:
    parked = Returning()
    parked.park("s", "a", 0.0)
    parked.park("s", "b", 1.0)  # it moved: parked on b only
    assert parked.counts() == {"a": 0, "b": 1}
    parked.forget("s")
    assert parked.counts() == {"a": 0, "b": 0}


def _request(rid: str, tokens: int, session: str, now: float,
             gpu: dict[str, int] | None = None, readers: int = 0) -> RequestView:
    res = Residency(chain_blocks=tokens // BT, block_tokens=BT, gpu=gpu or {}, readers=readers)
    return RequestView(request_id=rid, model="m", session=session, prompt_tokens=tokens,
                       residency=res, now=now)


def _served(policy: Locality, view: RequestView, replica: ReplicaView, seconds: float) -> None:
    decision = policy.choose(view, [replica])
    policy.dispatched(view, decision)
    policy.observe(Outcome(view, decision, True, ttft_s=seconds, total_s=seconds,
                           at=view.now + seconds))


def _agents_on_a(config: LocalityConfig, *, shared: bool = False) -> Locality:
    """Four agent sessions served on a (one came back after 2 s), all between turns now:
    their next turns are bound to a, whose GPU alone holds their 16k contexts (or, with
    ``shared``, b holds them as well)."""
    policy = Locality(config)
    a = ReplicaView(id="a", url="a")
    held = {"b": 16_384 // BT} if shared else None
    for i in range(4):
        _served(policy, _request(f"q{i}", 16_384, f"agent{i}", 0.5 * i, held), a, 0.5)
    _served(policy, _request("q4", 16_896, "agent0", 3.0, held), a, 0.2)
    return policy


def _new_session_placement(config: LocalityConfig, *, shared: bool = False,
                           readers: int = 0) -> str:
    # Without the ties by recent work (``new_balance_s``): a's agents sent work there,
    # which alone would send a new session to b; the charge is what is tested here.
    # And ties as wide as the model's running error: five replies are too few for the
    # no-evidence bound (``untrusted_ties``) to have come down, and this tests the charge.
    policy = _agents_on_a(dataclasses.replace(config, new_balance_s=0.0, untrusted_ties=False),
                          shared=shared)
    # A session whose rendezvous order puts a first: without the charge, ties go to a.
    session = next(s for s in (f"new{i}" for i in range(100))
                   if rendezvous_rank(s, [ReplicaView(id="a", url="a"),
                                          ReplicaView(id="b", url="b")])[0].id == "a")
    view = _request("n", 40_000, session, 4.0, readers=readers)
    return policy.choose(view, [ReplicaView(id="a", url="a"),
                                ReplicaView(id="b", url="b")]).replica


def test_a_new_sessions_long_start_avoids_the_replica_its_agents_come_back_to() -> None:
    """Both replicas idle, a's four agents between turns (back within ~2 s): a new
    agent's 40k-token start (seconds of prefill) placed on a would hold up every one of
    them, so it goes to b; without the charge the idle replicas tie and the session's hash
    order picks a."""
    assert _agents_on_a(LocalityConfig()).describe()["returning"] == {
        "gap_s": pytest.approx(2.5), "share": 1.0, "parked": {"a": 4}}
    assert _new_session_placement(LocalityConfig()) == "b"
    assert _new_session_placement(LocalityConfig(returning=0.0)) == "a"


def test_sessions_another_replica_could_serve_are_not_bound_to_theirs() -> None:
    """With b's GPU holding those agents' contexts too, their next turns can go to b: they
    are not parked on a, and the new session's tie goes by hash order again."""
    assert _new_session_placement(LocalityConfig(), shared=True) == "a"


def test_sessions_that_never_come_back_are_forgotten() -> None:
    """Completions without a session id are each their own session: none comes back, no
    gap is learnt, and they are forgotten after ``max_idle_s`` (or ``max_sessions``)."""
    parked = Returning(max_idle_s=60.0, max_sessions=3)
    for i in range(5):
        parked.park(f"c{i}", "a", float(i))
    assert parked.counts() == {"a": 3}  # c0 and c1 went first
    parked.expire(63.5)  # c2 and c3 parked more than 60 s ago
    assert parked.counts() == {"a": 1}
    assert parked.gap == 0.0 and parked.expected("a", 100.0, "new") == 0.0


def test_a_prefix_others_are_reading_is_not_charged_for_returning_sessions() -> None:
    """A request whose prefix others read right now is priced by a copy's benefit to them
    (``policies.copy_benefit``), not by the sessions it would hold up: charged for ~100
    readers of other documents parked on the replica that would copy it, a hot document
    was copied late (`docqa` without a pool at the knee, mean 0.67x -> 1.19x the best
    other). Here nobody holds the prefix, so no copy is priced: the tie goes by hash."""
    assert _new_session_placement(LocalityConfig(), readers=2) == "a"
