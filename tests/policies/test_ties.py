"""``locality``'s ties: scores the model cannot tell apart are settled by what is certain.

A copy's extra work is certain where the balance it buys is within the model's error
(``tie_work``); a prefix no replica holds is placed where the fewest requests are
committed, the readers expected of the new prefixes placed lately counted
(``new_balance_s``), since where it lands is where its readers will stay.
"""

from __future__ import annotations

import math
from dataclasses import replace

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
    8 shared prefixes on both engines (hit rate 0.80 against `prefix_affinity`'s 0.86).
    (No reply has been seen yet, so no copy is cheap: ``cheap_copy`` needs a service.)"""
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


def test_new_prefixes_go_where_the_fewest_went_lately() -> None:
    """Eight new prefixes whose sessions' hash order prefers a for six: by hash alone six
    land on a and stay there (their later readers follow them: 90/30 of 120 requests on
    the vLLM pair); placed where the fewest went lately they land four and four."""
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


def _serve(policy: Locality, view: RequestView, views: list[ReplicaView]) -> str:
    decision = policy.choose(view, views)
    policy.dispatched(view, decision)
    policy.observe(Outcome(view, decision, True, ttft_s=0.1, total_s=0.2, at=view.now + 0.2))
    return decision.replica


def test_new_prefixes_split_evenly_though_one_prefixs_readers_came_first() -> None:
    """One prefix placed, then three of its readers (hits, where it is), then seven new
    prefixes: by the work dispatched lately the hits made the first replica look busy, and
    the next four prefixes all went to the other, which then held five of the eight (the
    vLLM pair: 75/45 of 120 requests with the first readers' estimates still settling).
    Counted by the prefixes placed there lately, the eight split four and four."""
    policy = Locality()
    views = reps("a", "b")
    placed = {"p0": _serve(policy, req("n0", 1636, session="p0"), views)}
    now = 0.0
    for i in range(3):
        now += 0.5
        hit = req(f"h{i}", 1636, session=f"h{i}", now=now, gpu={placed["p0"]: BLOCKS})
        assert _serve(policy, hit, views) == placed["p0"]
    for i in range(1, 8):
        now += 0.5
        placed[f"p{i}"] = _serve(policy, req(f"n{i}", 1636, session=f"p{i}", now=now), views)
    assert sorted(placed.values()).count("a") == 4


def test_where_read_prefixes_went_outweighs_a_queue_within_the_tie() -> None:
    """Two prefixes placed on a, one on b whose first token is overdue (b still has it
    queued, the model expects it done: a tie). With every prompt so far a new prefix the
    traffic has told nothing against each being read again and again: a fourth goes to b.
    The queue is gone in a second, a prefix and its readers stay (by the queue first it
    went to a, three prefixes against one; on the vLLM pair 6/4 of 10 such placements)."""
    policy = Locality()
    for i, replica in enumerate("aab"):
        view = req(f"n{i}", 1636, session=f"p{i}", now=float(i))
        decision = Decision(replica, "miss")
        policy.dispatched(view, decision)
        if replica == "a":
            policy.observe(Outcome(view, decision, True, ttft_s=0.1, total_s=0.2, at=i + 0.2))
    assert policy.describe()["queued"] == {"a": 0, "b": 1}
    chosen = policy.choose(req("n3", 1636, session="p3", now=4.0), reps("a", "b"))
    assert chosen.replica == "b"


def test_one_off_prompts_leave_a_tie_to_the_queue() -> None:
    """A conversation trace's shape: nine prompts in ten new, each read about once (the
    vLLM pair's `chat`). b holds two more of the new prompts than a; a has one queued
    (overdue: a tie). The prompt goes to b: a new prefix here is worth about 0.1 of a
    request, a queued one a whole. Counted before the queues, or each as a request,
    it went to a (`chat` at the pair's knee: 1.8x slower on the mean). ``batching`` off:
    with it a request queued behind another is priced cheaper there, and it is no tie."""
    policy = Locality(LocalityConfig(batching=False))
    views = reps("a", "b")
    cold = 0
    for i in range(120):
        now = 0.1 * i
        if i % 10 == 9:  # a reader of a prefix held where it goes
            replica = "ab"[i // 10 % 2]
            view = req(f"w{i}", 1636, session=f"w{i}", now=now, gpu={replica: BLOCKS})
        else:  # b first four times, then in turn: b 56, a 52
            view = req(f"c{i}", 1636, session=f"c{i}", now=now)
            replica = "b" if cold < 4 or cold % 2 == 0 else "a"
            cold += 1
        decision = Decision(replica, "miss")
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.05, total_s=0.1, at=now + 0.1))
    queued = req("q", 1636, session="q", now=12.0)
    policy.dispatched(queued, Decision("a", "miss"))  # a: 53 new prefixes, one queued
    assert policy.describe()["queued"] == {"a": 1, "b": 0}
    learnt = policy.describe()["new_prefixes"]  # what GET /policy shows
    assert 0.1 < learnt["readers"] < 0.2 and learnt["placed"]["a"] < learnt["placed"]["b"]
    assert policy.choose(req("x", 1636, session="x", now=14.0), views).replica == "b"


def test_a_prompt_shorter_than_a_block_places_no_prefix() -> None:
    """A warm-up or a health check (no whole block) is no prefix whose readers follow it:
    after it a prefix on a, then one on b, the next new prefix goes to a, whose one
    prefix is the older (counted, the warm-up made a's two)."""
    policy = Locality()
    views = reps("a", "b")
    for i, (tokens, replica) in enumerate([(8, "a"), (1636, "a"), (1636, "b")]):
        view = req(f"n{i}", tokens, session=f"p{i}", now=float(i))
        decision = Decision(replica, "miss")
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.1, total_s=0.2, at=i + 0.2))
    # Placed at 1 s on a, at 2 s on b: a's count has decayed a little more.
    assert policy.choose(req("n3", 1636, session="p3", now=3.0), views).replica == "a"


def test_a_request_with_no_prompt_prefix_teaches_nothing() -> None:
    """``/tokenize`` and the like (``RequestView.generates`` false): balanced by our queue,
    then in flight; no calibration, queue, session or new-prefix state from them."""
    policy = Locality()
    views = reps("a", "b")
    policy.dispatched(req("q", 1636, session="q"), Decision("a", "miss"))  # one queued on a
    before = policy.describe()
    for i in range(40):
        view = replace(req(f"t{i}", 1636, session=f"n:{i}", now=0.1 * i), generates=False)
        decision = policy.choose(view, views)
        assert decision == Decision("b", "balanced")
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.002, total_s=0.002,
                               at=view.now + 0.002))
    assert policy.describe() == before


def _copy_or_wait(policy: Locality, queued: int = 2, now: float = 0.0) -> str:
    """``queued`` hits of ours queued on a, which holds a 1,536-token prefix; b idle.
    Where one more hit goes (b: a copy, the prefix recomputed there)."""
    for i in range(queued):
        view = req(f"q{i}", 1636, gpu={"a": BLOCKS}, session=f"s{i}", now=now)
        policy.dispatched(view, Decision("a", "gpu-hit"))
    view = req("x", 1636, gpu={"a": BLOCKS}, session="t", now=now)
    return policy.choose(view, reps("a", "b")).replica


def test_a_model_with_no_evidence_does_not_copy_on_the_priors_word() -> None:
    """Before any reply has taught calibration, the prior's prediction that the copy is
    quicker is not evidence: the tie is as wide as the worst error the fit accepts, and
    a tie adds no work (the vLLM pair: 6 of a run's 7 copies came in the second before
    the engines' first first tokens, on a prior whose recompute looks 1.6x a hit where it
    is 3x). Once replies have shown the prior right, the same copy is made; with the ties
    as wide as the running error only (``untrusted_ties=False``), it is made at once."""
    assert _copy_or_wait(Locality()) == "a"
    assert _copy_or_wait(Locality(LocalityConfig(untrusted_ties=False))) == "b"
    taught = Locality()
    for i in range(40):  # replies served alone, each exactly as the prior predicts
        view = req(f"w{i}", 1636, gpu={"a": BLOCKS}, session=f"w{i}", now=float(i))
        decision = Decision("a", "gpu-hit")
        service = taught.estimate(view, reps("a")[0]).ttft_s
        taught.dispatched(view, decision)
        taught.observe(Outcome(view, decision, True, ttft_s=service, total_s=service + 0.1,
                               at=i + service + 0.1, prompt_tokens=1636, cached_tokens=1536))
    assert taught.calibration.error_bound() < 0.05
    assert _copy_or_wait(taught) == "b"


def _taught(config: LocalityConfig, batched: bool,
            a: ReplicaView | None = None) -> Locality:
    """A policy with ``config`` that has sent 10 pairs of hits together to ``a`` (the
    engine as scraped), the second behind the first; each first token came as
    predicted, or (``batched``) the second's with the first's, as from an engine that
    prefills the waiting prompts together (its predicted wait and service missed by 2x)."""
    policy = Locality(config)
    a = a or reps("a")[0]
    for i in range(10):
        now = 10.0 * i
        first, second = (req(f"p{i}{k}", 1636, gpu={"a": BLOCKS}, session=f"p{i}{k}", now=now)
                         for k in "xy")
        alone = policy.estimate(first, a).ttft_s
        policy.dispatched(first, policy.choose(first, [a]))
        behind = policy.estimate(second, a).ttft_s  # its wait for ``first`` in it
        policy.dispatched(second, policy.choose(second, [a]))
        for view, t in ((first, alone), (second, alone if batched else behind)):
            policy.observe(Outcome(view, Decision("a", "gpu-hit"), True, ttft_s=t,
                                   total_s=t + 0.1, at=now + t + 0.1, prompt_tokens=1636,
                                   cached_tokens=1536))
    return policy


def test_the_error_behind_our_queue_is_measured_where_only_our_requests_queue() -> None:
    """``GET /policy``'s ``queued_error`` (and each logged copy's): the running error of
    first tokens predicted behind our own queue. It is about log 2 where an engine that
    batches answered each second hit with the first (``_taught``), about 0 where it
    answered as predicted, and nothing moves it where the engine held another router's
    request (our queue is not the engine's there). It decides nothing: ties sized by it
    were tried and not kept (the copy to b is made as before; the charge for a queue read
    as it was, not by the rate of the pairs, one every 10 s: ``test_sojourn.py``)."""
    config = LocalityConfig(calibrate=False, untrusted_ties=False, sojourn_arrivals_s=0.0)
    missed = _taught(config, batched=True)
    assert 0.5 < missed.describe()["queued_error"] < math.log(2)  # an EWMA of log 2's
    assert _copy_or_wait(missed, queued=1, now=300.0) == "b"
    right = _taught(config, batched=False)
    assert right.describe()["queued_error"] < 1e-9
    # The same pairs on an engine running another router's request.
    shared = _taught(config, batched=True, a=ReplicaView(id="a", url="a", running=1.0))
    assert shared.describe()["queued_error"] == 0.0


def _queued_hit_after_replies(config: LocalityConfig) -> str:
    """``_queued_hit`` once each replica has answered one request in 0.5 s (the mean
    observed service ``cheap_copy`` measures a copy's work against)."""
    policy = Locality(config)
    for i, replica in enumerate("ab"):
        view = req(f"w{i}", 1636, session=f"w{i}")
        decision = Decision(replica, "miss")
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.5, total_s=0.6, at=0.6))
    for i, replica in enumerate("aaab"):
        view = req(f"q{i}", 1636, gpu={"a": BLOCKS}, session=f"s{i}", now=1.0)
        policy.dispatched(view, Decision(replica, "gpu-hit"))
    return policy.choose(req("x", 1636, gpu={"a": BLOCKS}, session="t", now=1.0),
                         reps("a", "b")).replica


def test_a_copy_cheaper_than_a_service_is_settled_by_the_queues() -> None:
    """The case above after replies of 0.5 s: the copy to b recomputes 1,536 tokens,
    under the prior about 0.2 s, so with ``cheap_copy=1`` its work does not keep the
    prefix on the busier holder (as choosing by count, ``least_loaded``, matched
    the vLLM pair's TTFT); where the limit is below that work (0.01 x the service) or
    off, the tie keeps it where it is."""
    calm = LocalityConfig(calibrate=False)
    assert calm.cheap_copy == 0.0  # off by default
    assert _queued_hit_after_replies(calm) == "a"
    assert _queued_hit_after_replies(replace(calm, cheap_copy=0.01)) == "a"
    assert _queued_hit_after_replies(replace(calm, cheap_copy=1.0)) == "b"


def test_a_cheap_copy_is_not_made_where_the_holder_is_as_free() -> None:
    """After a reply, a hit on the idle holder's prefix with the other replica as idle:
    the copy would be cheap and tied, but nothing is queued anywhere, so it would buy no
    balance for its recompute; the hit stays where the prefix is, whichever order the
    session's hash gives the replicas."""
    for session in (f"t{i}" for i in range(8)):
        policy = Locality(LocalityConfig(calibrate=False, cheap_copy=1.0))
        view = req("w", 1636, session="w")
        decision = Decision("a", "miss")
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.5, total_s=0.6, at=0.6))
        hit = req("x", 1636, gpu={"a": BLOCKS}, session=session, now=1.0)
        assert policy.choose(hit, reps("a", "b")).replica == "a"
