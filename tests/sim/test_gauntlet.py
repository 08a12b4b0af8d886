"""The gauntlet: workload shapes, the design, the statistics, and a tiny end-to-end CLI run."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest

from router.cli import main
from sim.des.generators import BURST_OFF_S, BURST_ON_S, GENERATORS, on_off_starts
from sim.des.trace import load_trace
from sim.des.workload import OpenLoop, SessionWorkload
from sim.experiments.gauntlet import HARDWARE, design, hardware_row
from sim.experiments.gauntlet_report import ratios, t_ci
from sim.replica.profiles import STUDY_27B

CHUNK = STUDY_27B.chunk_tokens


def _sessions(name: str, scale: float = 1.0, duration: float = 600.0) -> SessionWorkload:
    load = GENERATORS[name](random.Random(1), scale, duration, CHUNK)
    assert isinstance(load, SessionWorkload)
    return load


def test_docqa_sessions_share_a_document_prefix_chain() -> None:
    load = _sessions("docqa")
    heads = [s.turns[0].chain[: 32768 // CHUNK] for s in load.sessions]
    assert len(load.sessions) > 20
    assert len(set(heads)) <= 8  # a few documents, many sessions each
    for s in load.sessions:
        assert 1 <= len(s.turns) <= 3
        assert len(s.turns[0].chain) * CHUNK >= 32768 - CHUNK


def test_agents_context_grows_in_many_short_turns() -> None:
    for s in _sessions("agents").sessions:
        assert 10 <= len(s.turns) <= 30
        assert 16384 <= s.turns[0].prompt_tokens <= 65536
        prompts = [t.prompt_tokens for t in s.turns]
        assert all(b > a for a, b in itertools.pairwise(prompts))
        assert all(b[: len(a)] == a for a, b in
                   zip((t.chain for t in s.turns), (t.chain for t in s.turns[1:]), strict=False))
        assert max(t.output_tokens for t in s.turns) <= 200 and s.think_s <= 3.0


def test_tenants_share_a_few_system_prompts() -> None:
    load = _sessions("tenants")
    heads = {s.turns[0].chain[: 4096 // CHUNK] for s in load.sessions}
    assert len(load.sessions) > 50 and len(heads) <= 8


def test_bursty_has_off_periods() -> None:
    starts = on_off_starts(random.Random(3), 1.0, 900.0)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) > 100
    assert sum(g >= BURST_OFF_S * 0.9 for g in gaps) >= 5  # one long gap per off window
    assert len(_sessions("bursty").sessions) > 0
    period = BURST_ON_S + BURST_OFF_S
    assert period == 90.0


def test_long_sessions_start_at_128k_and_mooncake_is_open_loop() -> None:
    for s in _sessions("long").sessions:
        assert 0.95 * 131072 <= s.turns[0].prompt_tokens <= 1.05 * 131072 and len(s.turns) == 6
    slow = GENERATORS["mooncake"](random.Random(0), 1.0, 60.0, CHUNK)
    fast = GENERATORS["mooncake"](random.Random(0), 2.0, 60.0, CHUNK)
    assert isinstance(slow, OpenLoop) and isinstance(fast, OpenLoop)
    assert len(fast.arrivals) > 1.5 * len(slow.arrivals)
    assert all(t < 60.0 for t, _ in fast.arrivals)


def test_mooncake_synthetic_ships_and_replays_its_multi_turn_prefixes() -> None:
    records = load_trace("mooncake-synthetic")
    assert len(records) == 3993  # the release's count (sim/des/traces/README.md)
    work = GENERATORS["mooncake-synthetic"](random.Random(0), 1.0, 300.0, CHUNK)
    assert isinstance(work, OpenLoop) and len(work.arrivals) > 500
    chains = [r.chain for _, r in work.arrivals if r.chain]
    firsts = [c[0] for c in chains]
    assert len(set(firsts)) < len(firsts)  # later turns reuse earlier turns' prefixes


def test_hardware_rows_and_the_one_axis_design() -> None:
    for name in HARDWARE:
        _profile, pool_on, slow = hardware_row(name, STUDY_27B)
        assert pool_on == (name != "no-pool") and (slow is not None) == (name == "hetero")
    assert hardware_row("attn-3x", STUDY_27B)[0].prefill_token2_s == pytest.approx(
        3 * STUDY_27B.prefill_token2_s)
    cells = design(["agents", "long"], ["study-27b", "small-gpu"], [4, 8], [1, 4])
    assert [c.axis for c in cells] == ["core", "core", "hardware", "fleet", "routers"]
    assert all(c.workload == "agents" for c in cells[2:])  # long is not an axis workload


def test_ratio_is_paired_by_seed_and_t_ci_brackets_the_mean() -> None:
    m, ci = t_ci([1.0, 2.0, 3.0])
    assert ci[0] < m == 2.0 < ci[1]
    cell = {"cell": "c", "axis": "core", "workload": "w", "hardware": "h", "replicas": 4,
            "routers": 1, "load": 1.0, "rate_scale": 1.0}
    raw = [{**cell, "policy": p, "seed": s, "n": 10, "mean": v, "p90": v}
           for p, vals in (("locality", (1.0, 2.0)), ("round_robin", (2.0, 4.0)),
                           ("least_loaded", (3.0, 3.0)))
           for s, v in enumerate(vals)]
    (row,) = ratios(raw)
    assert row["best_other_p90"] == "round_robin"
    assert row["ratio_p90"] == pytest.approx(0.5) and row["ratio_p90_ci"] == pytest.approx([0.5, 0.5])


def test_a_tiny_gauntlet_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "g.json", tmp_path / "g.png"
    rc = main(["sim", "gauntlet", "--workloads", "long", "--policies", "locality,round_robin",
               "--loads", "0.5,1", "--seeds", "1", "--duration", "120", "--hardware",
               "study-27b", "--replicas", "4", "--routers", "1", "--knee-iters", "1",
               "--jobs", "1", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    assert "locality / best other" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    for key in ("scenario", "params", "knees", "cells", "skipped", "rows", "ratios", "capacity",
                "raw", "wall_s"):
        assert key in doc
    knee = doc["knees"]["long"]
    assert {"rate_scale", "light_p90_s", "slo_p90_s", "probes", "bracket"} <= set(knee)
    assert {r["load"] for r in doc["ratios"]} == {0.5, 1.0}
    assert {r["policy"] for r in doc["rows"]} == {"locality", "round_robin"}
    for r in doc["rows"]:
        assert {"ttft_mean_s", "ttft_mean_ci", "ttft_p90_s", "ttft_p90_ci", "seeds"} <= set(r)
    assert all(c["capacity"] is None or not math.isnan(c["capacity"]) for c in doc["capacity"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_workload_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "gauntlet", "--workloads", "nope"]) == 2
    assert "unknown workloads" in capsys.readouterr().err


def test_knees_from_an_earlier_run_skip_the_search_and_keep_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"knees": {"long": {
        "rate_scale": 0.5, "light_p90_s": 30.0, "slo_p90_s": 150.0, "probes": []}}}))
    out = tmp_path / "g.json"
    args = ["sim", "gauntlet", "--workloads", "long", "--policies", "locality,round_robin",
            "--loads", "1", "--seeds", "1", "--duration", "60", "--hardware", "study-27b",
            "--replicas", "4", "--routers", "1", "--jobs", "1", "--knees-from", str(earlier),
            "--json", str(out)]
    assert main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["knees"]["long"] == {"rate_scale": 0.5, "given": True, "light_p90_s": 30.0,
                                    "slo_p90_s": 150.0}
    assert {r["rate_scale"] for r in doc["rows"]} == {0.5}
    # The SLO came with the knee, so capacity is judged (without it, it would be None).
    assert doc["capacity"] and all(c["slo_p90_s"] == 150.0 and c["capacity"] is not None
                                   for c in doc["capacity"])
    # An explicit --knee wins over the file, and then no SLO is claimed for it.
    assert main([*args, "--knee", "long=0.25"]) == 0
    doc = json.loads(out.read_text())
    assert doc["knees"]["long"] == {"rate_scale": 0.25, "given": True}
    assert {r["rate_scale"] for r in doc["rows"]} == {0.25}
    capsys.readouterr()


def test_knees_from_a_file_without_knees_exits_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    for text in ("{}", '{"knees": {"long": {"light_p90_s": 1.0}}}', '{"knees": [1]}'):
        bad.write_text(text)
        assert main(["sim", "gauntlet", "--workloads", "long", "--knees-from", str(bad)]) == 2
        assert "not a gauntlet JSON with knees" in capsys.readouterr().err
