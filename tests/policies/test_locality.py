"""The locality policy as a pure object: stay when cheapest, move when the pool makes it cheap."""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import random
from collections import deque

import pytest

from policies.base import Decision, Outcome, ReplicaView, RequestView, Residency, anchor_key
from policies.cost import STUDY_PRIOR, split_tokens
from policies.locality import Locality, LocalityConfig

BT = 256  # tokens per index block
K128 = 128 * 1024


def reps(*ids: str, healthy: bool = True) -> list[ReplicaView]:
    return [ReplicaView(id=i, url=i, healthy=healthy) for i in ids]


def req(rid: str, tokens: int, *, gpu: dict[str, int] | None = None, pool: int = 0,
        last: str | None = None, now: float = 0.0, session: str = "s",
        anchor: int = 0) -> RequestView:
    res = Residency(chain_blocks=tokens // BT, block_tokens=BT, gpu=gpu or {}, pool=pool)
    return RequestView(request_id=rid, model="m", session=session, prompt_tokens=tokens,
                       residency=res, last_replica=last, now=now, anchor=anchor)


def test_split_tokens_caps_at_prompt_minus_one() -> None:
    assert split_tokens(1000, 0, 0) == (0, 0, 1000)
    assert split_tokens(1000, 512, 768) == (512, 256, 232)
    assert split_tokens(1000, 2048, 0) == (999, 0, 1)
    assert split_tokens(1000, 0, 4096) == (0, 999, 1)


def test_prior_reproduces_the_study_points() -> None:
    assert STUDY_PRIOR.prefill_s(0, 131_072) == pytest.approx(31.715, rel=0.02)
    assert STUDY_PRIOR.prefill_s(0, 262_144) == pytest.approx(92.047, rel=0.02)
    assert STUDY_PRIOR.pool_load_s(131_072) + STUDY_PRIOR.prefill_s(131_072, 64) == \
        pytest.approx(0.605, rel=0.1)


def test_next_turn_stays_on_the_gpu_that_holds_it() -> None:
    policy = Locality()
    blocks = K128 // BT
    d = policy.choose(req("1", K128 + 500, gpu={"a": blocks}, pool=blocks, last="a"),
                      reps("a", "b"))
    assert d == Decision("a", "sticky", d.predicted_ttft_s)
    assert d.predicted_ttft_s is not None and d.predicted_ttft_s < 1.0


def test_moves_to_idle_replica_via_pool_when_its_own_is_busy() -> None:
    policy = Locality()
    blocks = K128 // BT
    # Three cold 128k prefills queued on "a": ~95 s of work ahead.
    for i in range(3):
        r = req(f"busy{i}", K128, session=f"other{i}")
        policy.dispatched(r, Decision("a", "miss"))
    d = policy.choose(req("x", K128 + 500, gpu={"a": blocks}, pool=blocks, last="a", now=1.0),
                      reps("a", "b"))
    assert d.replica == "b" and d.reason == "pool-hit"
    assert d.predicted_ttft_s is not None and d.predicted_ttft_s < 2.0


def test_without_pool_a_move_is_a_recompute_so_it_stays() -> None:
    policy = Locality()
    blocks = K128 // BT
    policy.dispatched(req("busy", 8192, session="o"), Decision("a", "miss"))
    d = policy.choose(req("x", K128 + 500, gpu={"a": blocks}, pool=0, last="a", now=0.1),
                      reps("a", "b"))
    assert d.replica == "a" and d.reason == "sticky"


def test_balance_when_load_beats_locality() -> None:
    policy = Locality()
    for i in range(4):
        policy.dispatched(req(f"b{i}", 4 * K128 // 2, session=f"o{i}"), Decision("a", "miss"))
    d = policy.choose(req("x", 4096, gpu={"a": 16}, last=None, now=0.0), reps("a", "b"))
    assert (d.replica, d.reason) == ("b", "balance")


def test_failover_goes_where_the_pool_serves_the_prefix() -> None:
    policy = Locality()
    blocks = K128 // BT
    views = [ReplicaView(id="a", url="a", healthy=False), *reps("b", "c")]
    d = policy.choose(req("x", K128 + 500, gpu={"a": blocks}, pool=blocks, last="a"), views)
    assert d.reason == "failover" and d.replica in {"b", "c"}
    assert d.predicted_ttft_s is not None and d.predicted_ttft_s < 2.0


def test_predicted_work_expires_with_time() -> None:
    policy = Locality()
    policy.dispatched(req("busy", K128, session="o"), Decision("a", "miss"))
    early = policy.estimate(req("x", 1024, now=1.0), reps("a")[0])
    late = policy.estimate(req("x", 1024, now=100.0), reps("a")[0])
    assert early.wait_s > 25 and late.wait_s == 0.0


def test_the_wait_is_the_fifo_walk_over_what_is_queued_whatever_leaves_when() -> None:
    """The queue's walk is kept incrementally (two stacks): after any mix of joins,
    first tokens at the head, out of order, and failures, the predicted wait is the walk
    itself, recomputed here from its definition over the requests still queued."""
    import random

    rng = random.Random(7)
    policy = Locality(LocalityConfig(calibrate=False))
    queued: list[tuple[RequestView, Decision, float]] = []  # FIFO: request, decision, service
    last_first_token = float("-inf")
    now, busy = 0.0, 0
    for i in range(600):
        now += rng.expovariate(1.0)
        if rng.random() < 0.55 or not queued:
            r = req(f"q{i}", rng.choice((512, 4096, 32_768)), now=now, session=f"s{i}")
            est = policy.estimate(r, reps("a")[0])
            queued.append((r, Decision("a", "miss"), est.load_s + est.prefill_s))
            policy.dispatched(r, Decision("a", "miss"))
        else:
            k = 0 if rng.random() < 0.7 else rng.randrange(len(queued))  # mostly the head
            r, d, _ = queued.pop(k)
            ok = rng.random() < 0.9
            policy.observe(Outcome(r, d, ok=ok, ttft_s=now - r.now if ok else None, at=now))
            last_first_token = max(last_first_token, now) if ok else last_first_token
        # A decision's time may be before the last dispatch's (its index lookup awaited
        # Redis meanwhile): then a later request's send time is where the walk resumes.
        probe = now + rng.uniform(-2.0, 2.0)
        if queued:
            head, _, service = queued[0]
            cursor = max(max(last_first_token, head.now) + service, probe)
            for r, _, service in queued[1:]:
                cursor = max(cursor, r.now) + service
        else:
            cursor = last_first_token
        wait = policy.estimate(req("p", 64, now=probe, session="p"), reps("a")[0]).wait_s
        assert wait == pytest.approx(max(0.0, cursor - probe), rel=1e-9, abs=1e-9)
        busy += wait > 0 and len(queued) > 2
    assert busy > 200  # the walk was long and mattered, not an idle replica's 0


def test_observe_releases_the_replica_and_calibrates() -> None:
    policy = Locality()
    scale = 0.01  # an emulator running at time scale 0.01
    for i in range(6):
        r = req(f"r{i}", 32_768, now=float(i), session=f"s{i}")
        d = policy.choose(r, reps("a"))
        policy.dispatched(r, d)
        assert d.predicted_ttft_s is not None
        observed = STUDY_PRIOR.prefill_s(0, 32_768) * scale
        policy.observe(Outcome(r, d, ok=True, ttft_s=observed))
    final = policy.choose(req("z", 32_768, now=10.0), reps("a"))
    assert final.predicted_ttft_s == pytest.approx(STUDY_PRIOR.prefill_s(0, 32_768) * scale,
                                                   rel=0.05)
    assert policy.estimate(req("q", 10, now=10.0), reps("a")[0]).wait_s == 0.0
    assert json.dumps(policy.describe())


def test_a_turn_sent_before_its_predecessor_finished_follows_it() -> None:
    """The router learns a session's replica and prefix only when a reply ends; near
    saturation the next turn arrives first. The policy's own dispatch log fills the gap."""
    policy = Locality()
    policy.dispatched(req("t1", 32_768, session="s"), Decision("b", "miss"))
    # Turn 2 extends turn 1; the index knows nothing yet, and "a" is idle.
    d = policy.choose(req("t2", 33_792, session="s", now=1.0), reps("a", "b"))
    assert (d.replica, d.reason) == ("b", "sticky")
    est = policy.estimate(req("t2", 33_792, session="s", now=1.0), reps("b")[0])
    assert est.gpu_tokens == 32_768 and est.new_tokens == 1_024
    # Once turn 1 is done the index is the truth again (it may since have been evicted).
    policy.observe(Outcome(req("t1", 32_768, session="s"), Decision("b", "miss"), True,
                           ttft_s=5.0, total_s=6.0, at=6.0))
    assert policy.estimate(req("t3", 34_816, session="s", now=7.0), reps("b")[0]).gpu_tokens == 0


def _deep_queues(policy: Locality, on_a: int, on_b: int) -> float:
    """Teach the policy a ~1.3 s service time, then queue 8k prefills on a and b. (First
    tokens only: calibration learns at a reply's end, so its model stays the prior's, and
    these tests, of the score's charges, run with ``untrusted_ties=False``.)"""
    t = 0.0
    for i in range(4):
        for r in ("a", "b"):
            q = req(f"w{r}{i}", 8192, session=f"w{r}{i}", now=t)
            policy.dispatched(q, Decision(r, "miss"))
            policy.observe(Outcome(q, Decision(r, "miss"), True, ttft_s=1.3,
                                   phase="first_token", at=t + 1.3))
            t += 1.3
    for r, n in (("a", on_a), ("b", on_b)):
        for i in range(n):
            policy.dispatched(req(f"q{r}{i}", 8192, session=f"q{r}{i}", now=t), Decision(r, "miss"))
    return t


def test_near_saturation_a_recompute_is_charged_to_the_whole_queue() -> None:
    """30 prefills queued on a, 12 on b, no pool: moving the session to b saves it ~18 s but
    adds a 32k recompute that the ~12 requests queueing behind it on b pay. Charging extra
    work once (load_aware_work=false) moves it; charging it per queued request keeps it."""
    blocks = 32_768 // BT
    decisions = {}
    for aware in (False, True):
        policy = Locality(LocalityConfig(load_aware_work=aware, untrusted_ties=False))
        now = _deep_queues(policy, 30, 12)
        decisions[aware] = policy.choose(req("x", 33_068, gpu={"a": blocks}, last="a", now=now),
                                         reps("a", "b")).replica
    assert decisions == {False: "b", True: "a"}
    # A short queue charges little: the pool still makes a move worth it.
    policy = Locality(LocalityConfig(untrusted_ties=False))
    now = _deep_queues(policy, 3, 0)
    d = policy.choose(req("y", 33_068, gpu={"a": blocks}, pool=blocks, last="a", now=now),
                      reps("a", "b"))
    assert (d.replica, d.reason) == ("b", "pool-hit")


def _badly_predicting(distrust: float) -> tuple[Locality, float]:
    """A policy whose observed service alternated 2x and 0.5x its prediction on b (its
    running error above 0.4), then one 8k prefill queued on a; (the policy, now)."""
    policy = Locality(LocalityConfig(distrust=distrust))
    for i in range(40):
        q = req(f"w{i}", 8192, session=f"w{i}", now=100.0 * i)
        d = policy.choose(q, reps("b"))
        policy.dispatched(q, d)
        assert d.predicted_ttft_s is not None
        ttft = d.predicted_ttft_s * (2.0 if i % 2 else 0.5)
        policy.observe(Outcome(q, d, True, ttft_s=ttft, at=100.0 * i + ttft))
    assert policy.calibration.error() > 0.4
    now = 100.0 * 40
    policy.dispatched(req("busy", 8192, session="o", now=now), Decision("a", "miss"))
    return policy, now + 0.1


def test_a_model_that_predicts_badly_moves_sessions_only_for_large_gains() -> None:
    """Predictions off by ~2x either way widen the hysteresis: a move the model believes
    gains ~35 % is within its own error, so the session stays; a trusted model moves it."""
    decisions = {}
    for distrust in (0.0, 1.0):
        policy, now = _badly_predicting(distrust)
        # The session (8k on a's GPU, in the pool too) may move.
        decisions[distrust] = policy.choose(
            req("x", 8192 + 300, gpu={"a": 32}, pool=32, last="a", now=now),
            reps("a", "b")).replica
    assert decisions == {0.0: "b", 1.0: "a"}


def test_a_model_that_predicts_badly_still_moves_a_session_whose_replica_holds_nothing_of_it(
) -> None:
    """The same bad model and queue, but nothing of the session's prompt is cached on a
    (evicted, or never shared): keeping it there saves nothing the model's error could
    defend, so the session moves to the idle replica as a trusted model would (an error
    of ~1 had kept every session where it began: chat on the vLLM pair)."""
    policy, now = _badly_predicting(1.0)
    held = policy.choose(req("x", 8192 + 300, gpu={"a": 32}, last="a", now=now),
                         reps("a", "b"))
    assert (held.replica, held.reason) == ("a", "sticky")  # no pool: a move is a recompute
    gone = policy.choose(req("y", 8192 + 300, last="a", now=now), reps("a", "b"))
    assert gone.replica == "b"


def test_equally_good_replicas_share_the_traffic() -> None:
    """Both replicas idle and holding the prefix; the calibration believes a 4 % faster
    (noise, on identical engines). New sessions must not all go to a, and a request
    goes where fewer of ours are queued when the scores tie."""
    policy = Locality()
    policy.calibration.set_deviation("a", -0.02)
    policy.calibration.set_deviation("b", 0.02)
    blocks = 1536 // BT
    chosen = [policy.choose(req(str(i), 1600, gpu={"a": blocks, "b": blocks},
                                session=f"s{i}"), reps("a", "b")).replica
              for i in range(200)]
    assert 70 < chosen.count("a") < 130  # rendezvous order: about half each
    policy.dispatched(req("q", 1600, session="q"), Decision("a", "gpu-hit"))
    assert all(policy.choose(req(str(i), 1600, gpu={"a": blocks, "b": blocks},
                                 session=f"t{i}"), reps("a", "b")).replica == "b"
               for i in range(20))  # a has one queued: a tie no more, or broken by queue
    strict = Locality(LocalityConfig(tie_margin=0.0, untrusted_ties=False))
    strict.calibration.set_deviation("a", -0.02)
    strict.calibration.set_deviation("b", 0.02)
    assert all(strict.choose(req(str(i), 1600, gpu={"a": blocks, "b": blocks},
                                 session=f"s{i}"), reps("a", "b")).replica == "a"
               for i in range(50))  # what it did: every tie to the "faster" one


def test_a_replica_believed_slower_is_not_charged_its_slowness_twice() -> None:
    """Both replicas hold the prefix and are idle; calibration believes b 2x slower and
    its own error is 1.2 (the vLLM pair's overflow engine, measured only in the bursts that
    made it overflow). b's slowness is in its predicted service; charged again as extra
    work, b scored 3x a's, outside even the widened ties, and took nothing. Its score is
    2x a's: within the model's error, a tie, and new sessions share the two."""
    policy = Locality()
    policy.calibration.set_deviation("a", 0.0)
    policy.calibration.set_deviation("b", math.log(2.0))
    policy.calibration.abs_error = 1.2
    blocks = 1536 // BT
    chosen = [policy.choose(req(str(i), 1600, gpu={"a": blocks, "b": blocks},
                                session=f"s{i}"), reps("a", "b")).replica
              for i in range(200)]
    assert 70 < chosen.count("a") < 130
    # Work that is really extra (a recompute where the other holds the prefix) still is:
    # a cold b is not a tie.
    assert all(policy.choose(req(str(i), 1600, gpu={"a": blocks}, session=f"t{i}"),
                             reps("a", "b")).replica == "a" for i in range(50))


def test_a_new_session_goes_where_fewer_of_ours_are_in_flight_when_the_scores_tie() -> None:
    """Nothing queued before a first token anywhere, but replica a is still streaming three
    replies (its sessions will come back to it): new sessions, which score the same on
    both, go to b. Placed by the session's hash order alone, long sessions pile up
    unevenly (agents without a pool: 46 to 188 requests per replica, p90 1.22x
    prefix_affinity's at a quarter of the knee)."""
    policy = Locality()
    views = [ReplicaView(id="a", url="a", in_flight=3), ReplicaView(id="b", url="b")]
    chosen = [policy.choose(req(str(i), 20_000, session=f"s{i}"), views).replica
              for i in range(50)]
    assert chosen == ["b"] * 50
    level = [ReplicaView(id="a", url="a", in_flight=3), ReplicaView(id="b", url="b", in_flight=3)]
    chosen = [policy.choose(req(str(i), 20_000, session=f"s{i}"), level).replica
              for i in range(200)]
    assert 70 < chosen.count("a") < 130  # level again: the session's order, about half each
    # Another router's requests on a (its engine runs more than our three): a session new
    # to us may be one that router placed, so the hash order every router shares decides.
    shared = [ReplicaView(id="a", url="a", in_flight=3, running=5), ReplicaView(id="b", url="b")]
    chosen = [policy.choose(req(str(i), 20_000, session=f"s{i}"), shared).replica
              for i in range(200)]
    assert 70 < chosen.count("a") < 130


def test_an_anchor_is_the_key_of_the_first_16384_tokens_and_a_shorter_prompt_has_none() -> None:
    document = list(range(1, 100))  # chained keys: key i stands for blocks 0..i
    assert anchor_key(document, BT) == document[63]  # 64 blocks of 256 tokens
    assert anchor_key([*document[:64], 999, 998], BT) == document[63]  # same opening
    assert anchor_key(document[:64], BT) == document[63]
    assert anchor_key(document[:63], BT) == 0  # a turn's key would change with the next
    assert anchor_key(document, 1024) == document[15]  # 1 kB blocks (text mode)
    assert anchor_key([], BT) == 0


def test_routers_that_share_nothing_send_a_new_documents_readers_to_one_replica() -> None:
    """Four routers, each its own policy, none holding the document: its readers (each
    its own session) tie on every replica. By the session's order each router computed
    the document on another replica; by the anchor's all send it to one, and documents
    still spread. A prompt this router knows a holder of is no tie to break."""
    routers = [Locality() for _ in range(4)]
    views = reps("a", "b", "c", "d")
    homes = []
    for doc in range(40):
        chosen = {p.choose(req(f"{doc}-{k}", 40_000, session=f"u{doc}-{k}", anchor=1000 + doc),
                           views).replica for k, p in enumerate(routers)}
        assert len(chosen) == 1, (doc, chosen)
        homes += chosen
    assert len(set(homes)) == 4
    by_session = [Locality(LocalityConfig(anchored=False)) for _ in range(4)]
    spread = [{p.choose(req(f"{doc}-{k}", 40_000, session=f"u{doc}-{k}", anchor=1000 + doc),
                        views).replica for k, p in enumerate(by_session)} for doc in range(40)]
    assert sum(len(s) > 1 for s in spread) > 30
    held = req("h", 40_000, gpu={"c": 40_000 // BT}, session="u0-0", anchor=1000)
    assert routers[0].choose(held, views).replica == "c"


def _document_question(config: LocalityConfig, queued_on_a: int, readers: int,
                        taught: tuple[int, float] | None = None) -> str:
    """Where a new session's question on a 32k document held by a (no pool) goes, with
    ``queued_on_a`` 8k prefills ahead of it there, b idle and ``readers`` of the document
    in flight; ``taught``: calibration's replies past its warm-up and running error, as
    if it had learnt them (its factors stay the prior's)."""
    blocks = 32_768 // BT
    policy = Locality(dataclasses.replace(config, untrusted_ties=False))
    now = _deep_queues(policy, queued_on_a, 0)
    if taught is not None:
        policy.calibration.observations = policy.calibration.warmup + taught[0]
        policy.calibration.abs_error = taught[1]
    res = Residency(chain_blocks=blocks + 1, block_tokens=BT, gpu={"a": blocks}, readers=readers)
    view = RequestView(request_id="x", model="m", session="new", prompt_tokens=33_000,
                       residency=res, now=now)
    return policy.choose(view, reps("a", "b")).replica


def test_a_copy_of_a_prefix_many_are_reading_is_charged_as_shared_work() -> None:
    """Five 8k prefills queued on the document's holder: the question copies it to b only
    when others are reading it now (``Residency.readers``): the copy's extra work is then
    shared by them, where for one reader it is the whole queue's loss."""
    chosen = {(readers, shared): _document_question(
        LocalityConfig(shared_copies=shared, copy_benefit=0.0), 5, readers)
        for readers in (0, 8) for shared in (True, False)}
    assert chosen == {(0, True): "a", (0, False): "a", (8, True): "b", (8, False): "a"}


def test_a_hot_document_is_copied_before_its_holder_waits_longer_than_the_copy() -> None:
    """Two 8k prefills (~2.7 s) queued on the holder: the copy's own prefill (~5.3 s) is
    longer than that wait, so a lone reader stays on a. With 8 of the document's readers
    in flight the copy also serves those to come (``copy_benefit``) and b takes it; with
    4 the copy scores within the tie margin of waiting, and a tie adds no work
    (``tie_work``; settled by the queues, b took it); without the benefit the shared
    copy alone waits for a deeper queue on a. These policies have had no reply: the
    benefit is counted before warm-up here (``benefit_after_warmup=False``,
    ``benefit_trust=False``); by default it is not, and the 8 readers' copy is not made
    (the vLLM pair's warm-up copies)."""
    policy = Locality()
    now = _deep_queues(policy, 2, 0)
    question = req("x", 33_000, gpu={"a": 32_768 // BT}, now=now, session="new")
    assert policy.estimate(question, reps("a")[0]).wait_s < 3.0
    assert policy.estimate(question, reps("b")[0]).ttft_s > 5.0
    chosen = {(readers, benefit): _document_question(
        LocalityConfig(copy_benefit=benefit, benefit_after_warmup=False, benefit_trust=False),
        2, readers)
        for readers in (0, 1, 4, 8) for benefit in (0.0, 1.0)}
    assert chosen == {(0, 0.0): "a", (1, 0.0): "a", (4, 0.0): "a", (8, 0.0): "a",
                      (0, 1.0): "a", (1, 1.0): "a", (4, 1.0): "a", (8, 1.0): "b"}
    assert _document_question(LocalityConfig(tie_work=False, benefit_after_warmup=False,
                                             benefit_trust=False), 2, 4) == "b"
    assert _document_question(LocalityConfig(), 2, 8) == "a"


def test_a_copys_benefit_counts_as_far_as_the_model_is_trusted() -> None:
    """The same 8 readers' copy as above, past calibration's warm-up: one reply past it,
    the error bound is still 0.8 x log(clip) (trust 0.2: on the vLLM pair a copy one
    reply past warm-up, bound 1.26, was the benefit's), and the benefit does not tip
    it; 40 replies past it with a running error of 0.05 the model is trusted (0.96) and
    the copy is made. Counted in full (``benefit_trust=False``), one reply is enough."""
    chosen = {(past, trust): _document_question(
        LocalityConfig(benefit_trust=trust), 2, 8, taught=(past, 0.05))
        for past in (1, 40) for trust in (True, False)}
    assert chosen == {(1, True): "a", (40, True): "b", (1, False): "b", (40, False): "b"}
    policy = Locality()  # ``GET /policy`` shows the weight the benefit counts with now
    assert policy.describe()["copy_benefit_weight"] == 0.0  # in warm-up
    policy.calibration.observations = policy.calibration.warmup + 40
    policy.calibration.abs_error = 0.05
    assert 0.95 < policy.describe()["copy_benefit_weight"] < 0.97


def test_a_reply_slowed_by_another_routers_requests_teaches_calibration_nothing() -> None:
    """Behind a load balancer, a router sees its own requests only; the engine's scraped
    counts say when it holds others' too. A service time measured then includes their
    prefills (with 4 routers on ``agents`` calibration learnt fixed x2.1 and load x0.26
    from such replies, and lost 1.2x to ``least_loaded``), so it is not learnt from."""
    learnt = {}
    for running in (1.0, 3.0):  # the engine holds our one request, or two others as well
        policy = Locality()
        for i in range(6):
            view = req(f"x{i}", 8192, session=f"s{i}", now=10.0 * i)
            replica = ReplicaView(id="a", url="a", in_flight=1, running=running)
            decision = policy.choose(view, [replica])
            policy.dispatched(view, decision)
            policy.observe(Outcome(view, decision, True, ttft_s=2.0, at=10.0 * i + 2.0))
        learnt[running] = policy.calibration.observations
    assert learnt == {1.0: 6, 3.0: 0}


def test_other_routers_waiting_requests_are_priced_at_our_own_service_not_theirs() -> None:
    """The engine's waiting requests beyond ours (other routers') wait about one service
    each; a reply served among them took their prefills' time too (10 s for a ~1.4 s
    prefill here), and pricing each of theirs at that made 4 routers on ``mooncake`` past
    saturation lose p90 1.11x: such a reply counts as its predicted service."""
    waits = {}
    for running in (1.0, 3.0):  # our one request alone, or among two of other routers
        policy = Locality()
        view = req("x", 8192, session="s", now=0.0)
        decision = policy.choose(view, [ReplicaView(id="a", url="a", in_flight=1,
                                                    running=running)])
        policy.dispatched(view, decision)
        predicted = decision.predicted_ttft_s
        assert predicted is not None and predicted < 2.0
        policy.observe(Outcome(view, decision, True, ttft_s=10.0, at=10.0))
        later = req("y", 8192, session="t", now=20.0)
        wait = policy.estimate(later, ReplicaView(id="a", url="a", waiting=3.0)).wait_s
        waits[running] = wait / predicted
    assert waits[1.0] == pytest.approx(3 * 10.0 / predicted)  # ours alone: what it took
    assert waits[3.0] == pytest.approx(3.0)  # among theirs: what it would take alone


def test_a_scrape_that_saw_our_own_ended_requests_sees_no_other_router() -> None:
    """A scrape is up to an interval old: it counted four requests of ours that have ended
    since. Against our count now (0) they looked like another router's: the reply that
    follows taught calibration nothing, and they were priced as waiting work, so the one
    replica everyone had used looked busy and the traffic went to the other (the vLLM
    pair: 16/104 in one run). Against our count when the scrape was read, they are ours."""
    stale = ReplicaView(id="a", url="a", running=1.0, waiting=3.0, in_flight_at_scrape=4)
    theirs = ReplicaView(id="a", url="a", running=1.0, waiting=3.0, in_flight_at_scrape=0)
    assert stale.others == 0.0 and theirs.others == 4.0
    learnt, waits = {}, {}
    for name, replica in (("stale", stale), ("theirs", theirs)):
        policy = Locality()
        for i in range(6):
            view = req(f"x{i}", 8192, session=f"s{i}", now=10.0 * i)
            decision = policy.choose(view, [replica])
            policy.dispatched(view, decision)
            policy.observe(Outcome(view, decision, True, ttft_s=2.0, at=10.0 * i + 2.0))
        learnt[name] = policy.calibration.observations
        waits[name] = policy.estimate(req("y", 8192, session="t", now=100.0), replica).wait_s
    assert learnt == {"stale": 6, "theirs": 0}
    assert waits["stale"] == 0.0 and waits["theirs"] > 0.0


def test_at_thousands_of_replies_a_second_one_in_k_teaches_calibration_without_bias() -> None:
    """A busy replica replying ~2,000 times a second (short requests on a fast engine):
    with ``calibration_rate`` 100 about one reply in 20 teaches calibration, and it
    predicts the mean service as well as when every reply teaches. Picking replies by time
    (the first after every 10 ms) would favour those that ended long intervals, and in a
    busy FIFO a reply's service is its interval: it learnt the replica 2.2x slower."""
    rng = random.Random(7)
    services = [rng.expovariate(2000.0) for _ in range(8000)]
    learnt: dict[float, tuple[int, float]] = {}
    for rate in (0.0, 100.0):
        policy = Locality(LocalityConfig(calibration_rate=rate))
        sent: deque[tuple[RequestView, Decision]] = deque()
        now = 0.0
        for i, service in enumerate(services):
            view = req(f"q{i}", 64, session=f"s{i % 50}", now=now)
            decision = policy.choose(view, reps("a"))
            policy.dispatched(view, decision)
            sent.append((view, decision))
            if len(sent) > 32:  # 32 in flight: each reply ends one service after the last
                now += service
                first, chosen = sent.popleft()
                policy.observe(Outcome(first, chosen, True, ttft_s=now - first.now, at=now))
        cal = policy.calibration
        # Every reply here was queued behind others: the fit's queued prediction is what it
        # taught (``predict`` bounds it by the unqueued factor, never taught here).
        learnt[rate] = (cal.observations,
                        cal.fitted("a", STUDY_PRIOR.terms(0, 64, 0), queued=True))
    (every, predicted_every), (sampled, predicted_sampled) = learnt[0.0], learnt[100.0]
    assert every > 7900 and 200 < sampled < 800
    mean = sum(services) / len(services)
    assert predicted_every == pytest.approx(mean, rel=0.15)
    assert predicted_sampled == pytest.approx(mean, rel=0.15)


def test_a_reply_whose_engine_cached_what_the_index_did_not_know_teaches_nothing() -> None:
    """With several routers each router's index misses the prefixes the others placed: it
    predicts a miss, the engine hits its cache and answers fast, and calibration learnt
    that fast hardware (4 routers on ``agents``: p90 1.39x ``least_loaded``). The engine's
    own count of cached tokens (vLLM's ``usage.prompt_tokens_details.cached_tokens``,
    reported at the reply's end) tells such replies apart; the first token's lesson waits
    for it."""
    true_s = STUDY_PRIOR.prefill_s(0, 8192)  # the prior is the truth here

    def run(cached: int | None) -> Locality:
        policy = Locality()
        for i in range(6):
            view = req(f"x{i}", 8192, session=f"s{i}", now=10.0 * i)  # index: nothing cached
            decision = policy.choose(view, reps("a"))
            policy.dispatched(view, decision)
            # The first is a true miss; then the engine holds all but the last block.
            ttft, count = (true_s, 0 if cached is not None else None) if i == 0 else (0.2, cached)
            before = policy.calibration.observations
            policy.observe(Outcome(view, decision, True, ttft_s=ttft, phase="first_token",
                                   at=10.0 * i + ttft))
            assert policy.calibration.observations == before  # the count comes at the end
            policy.observe(Outcome(view, decision, True, ttft_s=ttft, total_s=ttft + 1.0,
                                   at=10.0 * i + ttft + 1.0, prompt_tokens=8192,
                                   cached_tokens=count))
        return policy

    blind = run(7936)
    assert (blind.calibration.observations, blind.unexplained) == (1, 5)
    assert blind.describe()["unexplained_replies"] == 5
    assert blind.calibration.fleet_scale() == pytest.approx(1.0, rel=0.01)
    told = run(0)  # the engine says it computed it all: so the replica is that fast
    assert (told.calibration.observations, told.unexplained) == (6, 0)
    unreported = run(None)  # an engine that reports no details: learnt from at the end
    assert (unreported.calibration.observations, unreported.unexplained) == (6, 0)
    for learnt in (told, unreported):  # what the blind replies teach: hardware 2x+ faster
        assert learnt.calibration.fleet_scale() < 0.5


def test_the_index_counts_whole_blocks_and_the_engine_its_own_so_a_block_is_no_disagreement(
        ) -> None:
    """On the vLLM pair (1,500-token shared prefixes, 256-token index blocks, 32-token
    engine blocks) a hit is 5 blocks, 0.8 of the prompt, to the index and 0.98 to vLLM:
    a 0.1 tolerance alone would have dropped every cache hit and let only cold prefills
    teach (the cached-to-cold ratio, the one term that engine gets most wrong, unlearnt)."""
    policy = Locality()
    for i, (gpu, cached) in enumerate([(5, 1568), (5, 1568), (0, 1568), (0, 0)]):
        view = req(f"p{i}", 1600, gpu={"a": gpu}, session=f"s{i}", now=10.0 * i)
        decision = policy.choose(view, reps("a"))
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=0.1, total_s=0.2,
                               at=10.0 * i + 0.2, prompt_tokens=1600, cached_tokens=cached))
    # The hits the index knew teach; the one it believed cold (another router's) does not.
    assert (policy.calibration.observations, policy.unexplained) == (3, 1)


def test_copies_of_one_opening_sent_at_once_are_not_herded_onto_one_replica() -> None:
    """Many clients sending the same opening (no session id: one session key) with their
    requests in flight together are no conversation. A model that predicts badly widens
    the hysteresis past the whole score (margin >= 1: nothing ever moves), and kept them
    all on the replica of the first (97 % of a benchmark's identical requests on one of
    two). The conversation's next turn, longer than its request in flight, is still kept."""
    policy = Locality()
    for i in range(40):  # observed service 3x, then 1/3 of the prediction: error ~1
        q = req(f"w{i}", 8192, session=f"w{i}", now=100.0 * i)
        d = policy.choose(q, reps("b"))
        policy.dispatched(q, d)
        assert d.predicted_ttft_s is not None
        ttft = d.predicted_ttft_s * (3.0 if i % 2 else 1 / 3)
        policy.observe(Outcome(q, d, True, ttft_s=ttft, at=100.0 * i + ttft))
    assert policy.calibration.error() > 0.85
    now = 100.0 * 40
    blocks = 1536 // BT
    both = {"a": blocks, "b": blocks}
    placed = []
    for i in range(40):  # none finishes: all in flight together
        q = req(f"c{i}", 1600, gpu=both, session="same", now=now + 0.001 * i)
        d = policy.choose(q, reps("a", "b"))
        policy.dispatched(q, d)
        placed.append(d.replica)
    assert 12 <= placed.count("a") <= 28, placed
    # A next turn (its prompt extends the one in flight) stays where the session is.
    policy.dispatched(req("t1", 1600, gpu={"a": blocks}, session="conv", now=now),
                      Decision("a", "gpu-hit"))
    t2 = req("t2", 2600, gpu={"a": blocks}, session="conv", now=now + 0.5)
    assert policy.choose(t2, reps("a", "b")).replica == "a"


def _router_bound_split(policy: Locality, clients: int, replies: int = 20_000) -> float:
    """Two identical engines far faster than the router in front of them (a benchmark's
    fake engines): ``clients`` closed-loop clients send the same request (one session
    key), the router handles one event at a time (a dispatch or a reply, 20 us each),
    the engine answers 0.1 ms after a dispatch. The replies' FIFO gaps on a replica are
    then the router's pace of dispatches there, not the engine's service: the replica
    that gets more looks faster. Returns replica a's share of the last half."""
    events: list[tuple[float, int, str, RequestView | None, Decision | None]] = []
    for c in range(clients):
        events.append((0.0, c, "send", None, None))
    heapq.heapify(events)
    seq, free_at, done = clients, 0.0, 0
    counts = {"a": 0, "b": 0}
    while done < replies:
        t, _, kind, q, d = heapq.heappop(events)
        start = max(t, free_at)
        free_at = start + 20e-6  # the router's one core
        if kind == "send":
            q = req(f"r{seq}", 16, session="same", now=start)
            d = policy.choose(q, reps("a", "b"))
            policy.dispatched(q, d)
            heapq.heappush(events, (free_at + 1e-4, seq, "reply", q, d))
        else:
            assert q is not None and d is not None
            ttft = free_at - q.now
            policy.observe(Outcome(q, d, True, ttft_s=ttft, total_s=ttft, at=free_at))
            done += 1
            if done > replies // 2:
                counts[d.replica] += 1
            heapq.heappush(events, (free_at, seq, "send", None, None))
        seq += 1
    return counts["a"] / (counts["a"] + counts["b"])


def test_identical_engines_faster_than_the_router_share_its_traffic() -> None:
    """The replica that got more looked faster from its FIFO runs, got more still, and
    ended with the calibration's deviations at their bounds (0.5 and 2) and 79-97 % of
    a benchmark's requests: a model that wrong (running error ~1) tells replicas apart
    by no more than its error, so such scores tie and the queues decide."""
    for clients in (16, 64):  # before: 17 % and 79 % on a
        policy = Locality()
        # Over 8-96 clients (every 8th) noise alone leaves up to 0.125 from an even split,
        # whichever replies teach calibration (one in k, k rounded down or up).
        assert 0.35 < _router_bound_split(policy, clients) < 0.65
        # Not at the bounds (log 2 = 0.69): over 8-96 clients noise alone leaves up to 0.28.
        assert all(abs(v) < 0.35 for v in policy.calibration.log_prefill.values())


def _taught(share: float, batching: bool = True) -> Locality:
    """A policy whose calibration saw an engine answering 1,536-token prefixes: hits and
    misses alone at the prior's cost, and hits queued two deep paying ``share`` of the
    fixed term (an engine that batches the prompts waiting for a step: vLLM; 1: one at a
    time)."""
    policy = Locality(LocalityConfig(batching=batching))
    rng = random.Random(3)
    for _ in range(300):
        hit = STUDY_PRIOR.terms(1536, rng.randrange(50, 150), 0)
        miss = STUDY_PRIOR.terms(0, 1536 + rng.randrange(50, 150), 0)
        for terms in (hit, miss):
            policy.calibration.update("a", terms, sum(terms) * rng.lognormvariate(0, 0.05))
        for _ in range(2):
            queued = (hit[0] * share + sum(hit[1:])) * rng.lognormvariate(0, 0.05)
            policy.calibration.update("a", hit, queued, queued=True)
    return policy


def test_a_holder_whose_engine_batches_its_queue_keeps_the_prefix() -> None:
    """Two hits of ours are queued on a, which holds the prefix; b is idle. On an engine
    that computes one prompt at a time the third waits two full hits, and a copy to b
    (a recompute) is quicker; on one that batches the waiting prompts they cost a quarter
    of the fixed term each, and the copy does not pay. The policy tells the two apart from
    what its replies taught it; with one fixed factor for both (``batching=false``) the
    batching engine's queued replies pulled the factor down and the recompute on b was
    predicted a hit served alone 40 % cheaper than it is."""
    blocks = 1536 // BT
    chosen, alone = {}, {}
    for name, share, batching in (("fifo", 1.0, True), ("batched", 0.25, True),
                                  ("one factor", 0.25, False)):
        policy = _taught(share, batching)
        for i in range(2):
            view = req(f"q{i}", 1636, gpu={"a": blocks}, session=f"s{i}")
            policy.dispatched(view, policy.choose(view, reps("a", "b")))
        third = req("x", 1636, gpu={"a": blocks}, session="t")
        chosen[name] = policy.choose(third, reps("a", "b")).replica
        idle = req("y", 1636, gpu={"c": blocks}, session="u")  # a hit, nothing queued
        alone[name] = policy.estimate(idle, reps("c")[0]).ttft_s
    assert chosen["fifo"] == "b" and chosen["batched"] == "a"
    truth = sum(STUDY_PRIOR.terms(1536, 100, 0))
    assert alone["batched"] == pytest.approx(truth, rel=0.05)
    assert alone["one factor"] < 0.6 * truth
