"""``locality`` keeps its last copies, with what each decision saw (``policies.copy_log``)."""

from __future__ import annotations

from policies.base import Decision, Outcome, ReplicaView, RequestView, Residency
from policies.copy_log import CopyLog
from policies.cost import Estimate
from policies.locality import Locality, LocalityConfig

BT = 256
BLOCKS = 1536 // BT


def _req(rid: str, *, gpu: dict[str, int], session: str, now: float = 0.0) -> RequestView:
    res = Residency(chain_blocks=1636 // BT, block_tokens=BT, gpu=gpu)
    return RequestView(request_id=rid, model="m", session=session, prompt_tokens=1636,
                       residency=res, now=now)


def _place(policy: Locality, view: RequestView) -> Decision:
    decision = policy.choose(view, [ReplicaView(id="a", url="a"), ReplicaView(id="b", url="b")])
    policy.dispatched(view, decision)
    return decision


def test_a_copy_is_logged_with_what_it_was_decided_on_and_its_own_time() -> None:
    """Two hits queued on a, the prefix's holder; the third goes to b (a copy, with ties as
    wide as the running error only). The log holds that copy alone, the holder's queue as
    the decision saw it, scores that made b the choice, and, after its first token, the
    copy's time to first token; hits are not logged."""
    policy = Locality(LocalityConfig(untrusted_ties=False))
    for i in range(2):
        assert _place(policy, _req(f"q{i}", gpu={"a": BLOCKS}, session=f"s{i}")).replica == "a"
    copy = _place(policy, _req("x", gpu={"a": BLOCKS}, session="t", now=0.01))
    assert copy == Decision("b", "balance", copy.predicted_ttft_s)
    [entry] = policy.describe()["copies"]
    assert entry["request"] == "x" and entry["chosen"] == "b" and entry["at"] == 0.01
    a, b = entry["candidates"]["a"], entry["candidates"]["b"]
    assert (a["queued"], b["queued"]) == (2, 0)
    assert (a["cached_tokens"], b["cached_tokens"]) == (1536, 0)
    assert b["score"] < a["score"] and a["wait_s"] > 0 == b["wait_s"]
    assert b["service_s"] > a["service_s"]  # the copy computes the prefix again
    assert entry["ttft_s"] is None
    # Calibration's factors as the decision saw them (a queued prediction uses its own).
    assert entry["factors"] == {k: round(v, 4) for k, v in
                                policy.describe()["calibration"]["term_scale"].items()}
    assert set(entry["factors"]) >= {"fixed", "queued_fixed"}
    view = _req("x", gpu={"a": BLOCKS}, session="t", now=0.01)
    policy.observe(Outcome(view, copy, True, ttft_s=0.42, at=0.43, phase="first_token"))
    assert policy.describe()["copies"][0]["ttft_s"] == 0.42


def test_the_log_keeps_the_last_copies_and_forgets_the_oldest() -> None:
    log = CopyLog(size=2)
    est = {"a": Estimate("a", 0.1, 0.0, 0.05, 1536, 0, 100)}
    for i in range(3):
        log.add(f"r{i}", float(i), "a", est, {"a": 0.15}, {"a": 1}, 0.2, 0.3)
    assert [e["request"] for e in log.as_json()] == ["r1", "r2"]
    log.observed("r0", 0.5)  # forgotten: nothing to fill
    log.observed("r2", None)  # failed before its first token
    log.observed("r1", 0.25)
    assert [e["ttft_s"] for e in log.as_json()] == [0.25, None]
