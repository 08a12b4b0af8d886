"""The live load experiment: real router + emulated replicas, replica loss included."""

from __future__ import annotations

import asyncio

from sim.experiments.live import LiveConfig, plan_sessions, run_cell, run_live


def test_plans_are_seeded_and_shared_across_policies() -> None:
    cfg = LiveConfig(policies=("fixed",), sessions=5)
    assert plan_sessions(cfg, 0.1) == plan_sessions(cfg, 0.1)
    assert plan_sessions(cfg, 0.1) != plan_sessions(LiveConfig(policies=(), seed=1), 0.1)
    arrivals = [p.arrival_s for p in plan_sessions(cfg, 0.1)]
    assert arrivals == sorted(arrivals)


def test_rows_follow_the_simulator_contract() -> None:
    cfg = LiveConfig(policies=("fixed", "locality"), loads=(2.0,), sessions=3, turns=2,
                     min_start_tokens=256, max_start_tokens=1024, added_tokens=64,
                     think_s=0.05, time_scale=1.0, profile="tiny")
    doc = asyncio.run(run_live(cfg))
    assert [(r["policy"], r["load"], r["pool"]) for r in doc["rows"]] == [
        ("fixed", 2.0, "on"), ("locality", 2.0, "on")]
    for row in doc["rows"]:
        assert row["n"] == 6 and row["errors"] == 0
        assert 0 < row["ttft_p50_s"] <= row["ttft_p90_s"] <= row["ttft_p99_s"]


def test_locality_moves_sessions_of_a_lost_replica() -> None:
    cfg = LiveConfig(policies=("locality",), replicas=3, sessions=6, turns=4,
                     min_start_tokens=512, max_start_tokens=1024, added_tokens=64,
                     think_s=0.3, time_scale=1.0, profile="tiny", kill_at=0.6)
    turns = asyncio.run(run_cell(cfg, "locality", 50.0, lambda: None))
    assert all("error" not in t for t in turns)
    lost = turns[0]["lost_replica"]
    after = [t for t in turns if t["sent_s"] > 0.8]  # the kill at 0.6 s, ejection right after
    assert after, "some turns must run after the kill"
    assert all(t["replica"] != lost for t in after)
    moved = {t["session"] for t in turns if t["sent_s"] < 0.6 and t["replica"] == lost}
    first_after = {}
    for t in sorted((t for t in turns if t["sent_s"] > 0.6), key=lambda t: t["sent_s"]):
        first_after.setdefault(t["session"], t)
    reasons = {first_after[s]["reason"] for s in moved if s in first_after}
    assert reasons and reasons <= {"failover", "sticky"}
    assert "failover" in reasons
