"""Workload generators and trace parsing: seeded, prefix-consistent, mapped onto chunk keys."""

from __future__ import annotations

import random

import pytest

from sim.des.trace import (
    TRACE_KEY_BASE,
    TraceFormatError,
    chunk_chain,
    load_trace,
    parse_lines,
    session_key,
    trace_path,
    trace_workload,
)
from sim.des.workload import KeyAlloc, SessionMix, poisson_sessions, prefix_chain, study_session

# The Mooncake conversation trace (kvcache-ai/Mooncake, FAST'25 release).
TRACE = trace_path("mooncake")  # shipped with the package


def _sessions(seed: int) -> list[tuple[float, int, tuple[int, ...]]]:
    w = poisson_sessions(random.Random(seed), 0.5, 600.0, SessionMix(), 1568)
    return [(t, r.prompt_tokens, r.chain) for t, r in w.initial(0.0)]


def test_poisson_sessions_are_deterministic_by_seed() -> None:
    assert _sessions(3) == _sessions(3)
    assert _sessions(3) != _sessions(4)


def test_session_turns_extend_one_chain_and_share_the_system_prompt() -> None:
    w = poisson_sessions(random.Random(1), 1.0, 300.0, SessionMix(), 1568)
    a, b = w.sessions[0], w.sessions[1]
    for prev, nxt in zip(a.turns, a.turns[1:], strict=False):
        assert nxt.prompt_tokens > prev.prompt_tokens
        assert nxt.chain[: len(prev.chain)] == prev.chain
        assert len(nxt.chain) * 1568 <= nxt.prompt_tokens
    assert a.turns[0].chain[:2] == b.turns[0].chain[:2]  # 3,136-token system prompt
    assert a.turns[0].chain[2] != b.turns[0].chain[2]


def test_study_session_and_prefix_chain_shapes() -> None:
    keys = KeyAlloc()
    s = study_session(keys, random.Random(0), "s", 32768, 1568)
    assert [t.prompt_tokens for t in s.turns] == [32768 + k * 2056 for k in range(6)]
    assert all(t.output_tokens == 8 for t in s.turns)
    doc = prefix_chain(keys, random.Random(0), "d", 131072, 1568)
    assert doc.turns[0].chain == doc.turns[1].chain and len(doc.turns[0].chain) == 84
    assert doc.turns[0].prompt_tokens == 84 * 1568 + 64


def test_sequential_workload_releases_the_next_turn_after_completion() -> None:
    from sim.des.workload import SessionWorkload

    keys = KeyAlloc()
    specs = [prefix_chain(keys, random.Random(0), f"d{i}", 4096, 1568) for i in range(2)]
    w = SessionWorkload(specs, gap_s=1.0)
    [(t0, first)] = w.initial(5.0)
    assert t0 == 5.0 and first.turn == 0
    [(t1, second)] = w.after(first, 7.0)
    assert (t1, second.session, second.turn) == (7.0, "d0", 1)
    [(t2, third)] = w.after(second, 9.0)
    assert (t2, third.session) == (10.0, "d1")
    assert w.after(w.after(third, 11.0)[0][1], 12.0) == []


def test_chunk_chain_maps_512_token_blocks_onto_1568_token_chunks() -> None:
    ids = list(range(100, 110))  # 10 blocks = 5,120 tokens
    chain = chunk_chain(ids, 5000, 1568)
    # 3 whole chunks; chunk j ends at token (j+1)*1568 - 1, in block 3, 6, 9.
    assert chain == tuple(TRACE_KEY_BASE + ids[k] for k in (3, 6, 9))
    # Two requests sharing only blocks 0..3 share exactly the first chunk.
    other = chunk_chain([*ids[:4], 7, 8, 9, 10, 11, 12], 5000, 1568)
    assert other[0] == chain[0] and other[1] != chain[1]


def test_parse_lines_reads_records_and_rejects_bad_ones() -> None:
    lines = ['{"timestamp": 5, "input_length": 1000, "output_length": 0, "hash_ids": [0, 1]}', ""]
    [rec] = parse_lines(lines)
    assert rec.hash_ids == (0, 1) and rec.timestamp_ms == 5.0
    assert session_key(rec.hash_ids) == "t0-1"
    with pytest.raises(TraceFormatError):
        parse_lines(['{"timestamp": 5}'])
    w = trace_workload([rec], 512, time_scale=2.0)
    [(t, req)] = w.initial(1.0)
    assert t == 1.0 and req.output_tokens == 1 and req.chain == (TRACE_KEY_BASE + 0,)


def test_the_conversation_trace_parses_whole() -> None:
    records = load_trace(TRACE)
    assert len(records) == 12031
    assert all(len(r.hash_ids) == -(-r.input_length // 512) for r in records[:500])
    w = trace_workload(records[:200], 1568)
    times = [t for t, _ in w.initial(0.0)]
    assert min(times) == 0.0
