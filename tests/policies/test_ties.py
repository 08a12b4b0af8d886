"""``locality``'s ties: scores the model cannot tell apart are settled by what is certain.

A copy's extra work is certain where the balance it buys is within the model's error
(``tie_work``); a prefix no replica holds is placed where the least work went lately
(``new_balance_s``), since where it lands is where its readers will stay.
"""

from __future__ import annotations

from policies.base import Decision, Outcome, ReplicaView, RequestView, Residency
from policies.hashing import rendezvous_rank
from policies.locality import Locality, LocalityConfig

BT = 256  # tokens per index block
BLOCKS = 1536 // BT  # a 1,536-token shared prefix, as vLLM's prefix_repetition sends


def reps(*ids: str) -> list[ReplicaView]:
    return [ReplicaView(id=i, url=i) for i in ids]


def req(rid: str, tokens: int, *, gpu: dict[str, int] | None = None, now: float = 0.0,
        session: str = "s", anchor: int = 0) -> RequestView:
    res = Residency(chain_blocks=tokens // BT, block_tokens=BT, gpu=gpu or {})
    return RequestView(request_id=rid, model="m", session=session, prompt_tokens=tokens,
                       residency=res, now=now, anchor=anchor)


def _queued_hit(config: LocalityConfig) -> str:
    """Where a hit on a's prefix goes with three hits of ours queued on a and one on b."""
    policy = Locality(config)
    for i, replica in enumerate("aaab"):
        view = req(f"q{i}", 1636, gpu={"a": BLOCKS}, session=f"s{i}")
        policy.dispatched(view, Decision(replica, "gpu-hit"))
    return policy.choose(req("x", 1636, gpu={"a": BLOCKS}, session="t"), reps("a", "b")).replica


def test_a_copy_the_model_cannot_tell_from_waiting_is_not_made() -> None:
    """Three hits queued on the holder a, one request on b: the copy to b (a recompute)
    and the wait on a score within the tie margin. The tie keeps the prefix where it is;
    settled by the fewest queued it was copied, which on the vLLM pair put each of the
    8 shared prefixes on both engines (hit rate 0.80 against `prefix_affinity`'s 0.86)."""
    assert _queued_hit(LocalityConfig()) == "a"
    assert _queued_hit(LocalityConfig(tie_work=False)) == "b"


def _new_prefixes(config: LocalityConfig, sessions: list[str]) -> list[str]:
    """Where each of ``sessions``' first request (a prefix no replica holds) goes, one
    after another on two idle replicas, each answered before the next arrives."""
    policy = Locality(config)
    placed = []
    for i, session in enumerate(sessions):
        now = 2.0 * i
        view = req(f"n{i}", 1636, session=session, now=now)
        decision = policy.choose(view, reps("a", "b"))
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.5, total_s=0.6, at=now + 0.6))
        placed.append(decision.replica)
    return placed


def test_new_prefixes_go_where_the_least_work_went_lately() -> None:
    """Eight new prefixes whose sessions' hash order prefers a for six: by hash alone six
    land on a and stay there (their later readers follow them: 90/30 of 120 requests on
    the vLLM pair); placed by the work dispatched lately they land four and four."""
    views = [ReplicaView(id="a", url="a"), ReplicaView(id="b", url="b")]
    first = {s: rendezvous_rank(s, views)[0].id for s in (f"p{i}" for i in range(100))}
    sessions = [s for s in first if first[s] == "a"][:6] + [s for s in first if first[s] == "b"][:2]
    assert _new_prefixes(LocalityConfig(new_balance_s=0.0), sessions).count("a") == 6
    placed = _new_prefixes(LocalityConfig(), sessions)
    assert placed.count("a") == 4


def test_a_new_documents_readers_still_follow_its_anchor() -> None:
    """A prompt of 16k tokens or more that nobody holds goes by its anchor's order (the
    placement routers that share nothing agree on), not by this router's recent work."""
    views = reps("a", "b")
    policy = Locality()
    home = rendezvous_rank("#7", views)[0].id
    for i in range(6):  # recent work on home
        view = req(f"w{i}", 20_000, session=f"w{i}", anchor=7, now=float(i))
        decision = Decision(home, "miss")
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.5, total_s=0.6, at=i + 0.6))
    chosen = policy.choose(req("x", 20_000, session="x", anchor=7, now=10.0), views)
    assert chosen.replica == home
