"""The replica model: hits, pool sharing, queueing, decode, fault flag, and the study fit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.experiments.study import compare, cross_replica_ttft, format_table
from sim.replica.model import ReplicaModel, ReplicaRequest
from sim.replica.profiles import STUDY_27B, TINY, ProfileError, load_profile

B = TINY.chunk_tokens
DOC = tuple(range(100, 164))  # 64 blocks = 1,024 tokens; the GPU holds 64 blocks


def req(chain: tuple[int, ...], arrival: float, extra: int = 8, out: int = 4) -> ReplicaRequest:
    return ReplicaRequest(chain, len(chain) * B + extra, out, arrival)


def pair(pool_on: bool = True) -> tuple[ReplicaModel, ReplicaModel]:
    pool = TINY.make_pool(enabled=pool_on)
    return ReplicaModel("a", TINY, pool), ReplicaModel("b", TINY, pool)


def test_cold_then_repeat_on_the_same_replica_hits_the_gpu() -> None:
    a, _ = pair()
    cold = a.admit(req(DOC[:32], 0.0))
    assert (cold.gpu_hit_tokens, cold.pool_hit_tokens, cold.prefilled_tokens) == (0, 0, 520)
    assert cold.ttft_s == pytest.approx(TINY.prefill_s(0, 520) + cold.store_s)
    warm = a.admit(req(DOC[:32], cold.finish_at))
    assert warm.gpu_hit_tokens == 512 and warm.pool_hit_tokens == 0
    assert warm.prefilled_tokens == 8 and warm.load_s == 0.0
    assert warm.ttft_s < cold.ttft_s / 10


def test_a_fully_cached_prompt_still_computes_one_token() -> None:
    a, _ = pair()
    first = a.admit(ReplicaRequest(DOC[:4], 4 * B, 1, 0.0))
    again = a.admit(ReplicaRequest(DOC[:4], 4 * B, 1, first.finish_at))
    assert again.prefilled_tokens == 1 and again.cached_tokens == 4 * B - 1


def test_two_models_share_the_pool() -> None:
    a, b = pair()
    cold = a.admit(req(DOC[:32], 0.0))
    moved = b.admit(req(DOC[:32], cold.finish_at))
    assert moved.gpu_hit_tokens == 0 and moved.pool_hit_tokens == 512
    assert moved.load_s == pytest.approx(TINY.pool_load_s(512))
    assert moved.ttft_s < cold.ttft_s / 3
    assert moved.pool.stored == ()  # already in the pool: nothing new written
    assert moved.gpu.stored == DOC[:32]  # but B's GPU now holds it
    assert a.pool is b.pool and a.pool is not None and a.pool.loads == 1


def test_pool_off_makes_cross_replica_a_cold_prefill() -> None:
    a, b = pair(pool_on=False)
    cold = a.admit(req(DOC[:32], 0.0))
    moved = b.admit(req(DOC[:32], cold.finish_at))
    assert moved.cached_tokens == 0
    assert moved.ttft_s == pytest.approx(cold.ttft_s)
    assert cold.store_s == 0.0 and cold.pool.stored == ()


def test_gpu_hit_beats_pool_and_only_the_rest_is_loaded() -> None:
    a, b = pair()
    t = a.admit(req(DOC[:8], 0.0)).finish_at
    t = b.admit(req(DOC[:8], t)).finish_at  # B's GPU: 8 blocks
    t = a.admit(req(DOC[:20], t)).finish_at  # pool: 20 blocks
    plan = b.admit(req(DOC[:20], t))
    assert plan.gpu_hit_tokens == 8 * B and plan.pool_hit_tokens == 12 * B


def test_a_prefill_in_progress_is_not_yet_in_the_pool() -> None:
    a, b = pair()
    cold = a.admit(req(DOC[:32], 0.0))
    early = b.admit(req(DOC[:32], cold.first_token_at / 2))
    assert early.cached_tokens == 0


def test_concurrent_prefills_queue_one_at_a_time() -> None:
    a, _ = pair()
    first = a.admit(req(DOC[:32], 0.0))
    second = a.admit(req(tuple(range(900, 932)), 0.01))
    assert second.start == pytest.approx(first.first_token_at)
    assert second.queue_s == pytest.approx(first.first_token_at - 0.01)
    assert a.prefill_free_at == pytest.approx(second.first_token_at)
    assert a.waiting(0.02) == 1 and a.running(0.02) == 1
    assert a.waiting(second.start) == 0 and a.running(second.start) == 2
    # Queued behind a prefill of the same prefix, it hits what that prefill wrote.
    third = a.admit(req(DOC[:32], 0.02))
    assert third.gpu_hit_tokens == 512


def test_an_engine_that_batches_charges_a_queued_prompt_its_share_of_the_fixed_term() -> None:
    """``queued_fixed_share``: a prompt that waited for the engine pays that share of the
    fixed prefill term (the step's cost shared with the prompts batched in it); one that
    found the engine free pays it all, as with the default (one prompt at a time)."""
    batched = replace(TINY, queued_fixed_share=0.25)
    a, b = ReplicaModel("a", TINY), ReplicaModel("b", batched)
    for model in (a, b):
        model.admit(req(tuple(range(900, 932)), 0.0))
    fifo, shared = (m.admit(req(tuple(range(700, 732)), 0.001)) for m in (a, b))
    assert fifo.queue_s > 0 and shared.queue_s > 0
    assert fifo.prefill_s - shared.prefill_s == pytest.approx(0.75 * TINY.prefill_fixed_s)
    alone = b.admit(req(tuple(range(500, 532)), 100.0))
    assert alone.queue_s == 0 and alone.prefill_s == pytest.approx(fifo.prefill_s)


def test_decode_time_and_batch_slowdown() -> None:
    a, _ = pair()
    alone = a.admit(req(DOC[:8], 0.0, out=50))
    assert alone.finish_at == pytest.approx(alone.first_token_at + 49 * alone.tpot_s)
    assert alone.tpot_s == pytest.approx(TINY.tpot(alone.prompt_tokens + 25))
    batched = a.admit(req(DOC[:8], alone.first_token_at, out=50))
    assert batched.tpot_s > alone.tpot_s  # it shares decode steps with the first


def test_plan_reports_gpu_evictions_for_kv_events() -> None:
    a, _ = pair()
    first = a.admit(req(DOC, 0.0))
    assert first.gpu.stored == DOC and first.pool.stored == DOC
    other = tuple(range(500, 510))
    second = a.admit(req(other, first.finish_at))
    assert len(second.gpu.evicted) == 10 and a.gpu.used_blocks == 64
    assert a.kv_usage() == pytest.approx(1.0)


def test_corrupt_pool_marks_only_pool_loads() -> None:
    a, b = pair()
    assert a.pool is not None
    a.pool.corrupt = True
    cold = a.admit(req(DOC[:8], 0.0))
    assert not cold.corrupt
    gpu_hit = a.admit(req(DOC[:8], cold.finish_at))
    assert not gpu_hit.corrupt
    loaded = b.admit(req(DOC[:8], gpu_hit.finish_at))
    assert loaded.corrupt
    a.pool.corrupt = False
    _, c = pair()
    assert not c.admit(req(DOC[:8], 0.0)).corrupt


def test_restart_empties_the_gpu_and_queue() -> None:
    a, _ = pair(pool_on=False)
    a.admit(req(DOC[:8], 0.0))
    assert set(a.restart()) == set(DOC[:8])
    assert a.admit(req(DOC[:8], 0.0)).cached_tokens == 0


def test_bad_requests_are_refused() -> None:
    a, _ = pair()
    a.admit(req(DOC[:2], 5.0))
    with pytest.raises(ValueError, match="before"):
        a.admit(req(DOC[:2], 4.0))
    with pytest.raises(ValueError, match="full blocks"):
        a.admit(ReplicaRequest(DOC[:2], B, 1, 6.0))
    with pytest.raises(ValueError, match="pool and profile"):
        ReplicaModel("x", STUDY_27B, TINY.make_pool())


def test_prefill_is_superlinear_and_profiles_are_named() -> None:
    p = load_profile("study-27b")
    assert p.prefill_s(0, 2 * 131072) > 2.5 * p.prefill_s(0, 131072)
    assert p.prefill_s(131072, 64) - p.prefill_fixed_s < 0.05  # a question at depth
    assert p.pool_load_s(0) == 0.0
    assert p.gpu_capacity_blocks > 1000 and p.make_pool().capacity_chunks > 5000
    with pytest.raises(ProfileError, match=r"built-in: .*study-27b"):
        load_profile("nope")


def test_study_pool_hit_is_near_the_physical_pool_numbers() -> None:
    off = cross_replica_ttft(STUDY_27B, 131072, pool_on=False)
    on = cross_replica_ttft(STUDY_27B, 131072, pool_on=True)
    assert off / on > 40


def test_the_study_is_reproduced_within_ten_percent() -> None:
    rows = compare(STUDY_27B)
    table = format_table(rows)
    for row in rows:
        if row.unit == "%":
            if "fixed" in row.scenario:
                assert abs(row.ours) < 3, table
        else:
            assert abs(row.error) < 0.10, table
