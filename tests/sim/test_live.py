"""The live load experiment: real router + emulated replicas, replica loss included."""

from __future__ import annotations

import asyncio
from typing import Any

from sim.experiments.live import LiveConfig, failover_summary, plan_sessions, run_cell, run_live


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
    # When the stop began and ended: at 0.6 s or later on a busy machine, and not at once.
    began, killed = turns[0]["kill_began_s"], turns[0]["killed_s"]
    assert 0.6 <= began <= killed
    after = [t for t in turns if t["sent_s"] > killed]
    assert after, "some turns must run after the kill"
    assert all(t["replica"] != lost for t in after)
    # Each session on the lost replica leaves it, at its first turn sent after the stop began
    # that did not still reach it, as a failover.
    on_lost = {t["session"] for t in turns if t["sent_s"] < began and t["replica"] == lost}
    left: dict[int, dict[str, Any]] = {}
    for t in sorted((t for t in turns if t["sent_s"] >= began and t["replica"] != lost),
                    key=lambda t: t["sent_s"]):
        left.setdefault(t["session"], t)
    reasons = [left[s]["reason"] for s in on_lost if s in left]
    assert reasons and set(reasons) == {"failover"}
    [summary] = failover_summary({"params": {"kill_at": 0.6}, "turns": turns})
    assert summary["load"] == 50.0 and summary["moved_sessions"] == len(reasons)


def _turn(load: float, session: int, sent_s: float, replica: str, began_s: float
          ) -> dict[str, Any]:
    return {"policy": "locality", "load": load, "session": session, "turn": 1,
            "sent_s": sent_s, "replica": replica, "reason": "sticky", "ttft_s": 0.1,
            "lost_replica": "a", "kill_began_s": began_s, "killed_s": began_s + 0.1}


def test_failover_summary_keeps_cells_apart_and_counts_from_the_recorded_kill() -> None:
    # Load 1: the kill asked for at 0.6 s began at 0.9 s, so session 0's turn at 0.7 s and
    # its turn at 0.95 s (sent while the replica stopped) still reached replica a, and its
    # turn at 1.0 s is the one that moved. Load 2 has the same session numbers and times,
    # which must not be read as turns of load 1's cell.
    turns = [_turn(1.0, 0, 0.1, "a", 0.9), _turn(1.0, 0, 0.7, "a", 0.9),
             _turn(1.0, 0, 0.95, "a", 0.9), _turn(1.0, 0, 1.0, "b", 0.9),
             _turn(2.0, 0, 0.65, "a", 0.6), _turn(2.0, 0, 0.8, "c", 0.6)]
    rows = failover_summary({"params": {"kill_at": 0.6}, "turns": turns})
    assert [(r["load"], r["moved_sessions"]) for r in rows] == [(1.0, 1), (2.0, 1)]
