"""Experiments: the study reproduced through the policies, the JSON contract, determinism,
and what a policy sees (the router-built index, not the models' ground truth)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from policies.base import BasePolicy, Decision, Outcome, ReplicaView, RequestView
from sim.des.cluster import Cluster
from sim.des.simulation import Run
from sim.des.trace import parse_lines
from sim.des.workload import KeyAlloc, SessionMix, SessionWorkload, prefix_chain
from sim.experiments import scenarios
from sim.experiments.arms import SimArm, run_arm
from sim.experiments.reproduce import passes, run_study
from sim.experiments.sim_report import markdown, plot, write_json
from sim.replica.model import ReplicaModel
from sim.replica.profiles import STUDY_27B, TINY

CONTRACT = ("policy", "pool", "n", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s")
SMALL_MIX = SessionMix(system_tokens=32, first_tokens=(64, 512), added_tokens=(16, 64),
                       output_tokens=(4, 16), think_s=1.0)


def test_study_reproduction_fast_version() -> None:
    result = run_study(STUDY_27B, rounds=4, session_every=2)
    assert passes(result.comparisons or [])
    by_name = {c["name"]: c for c in result.comparisons or []}
    assert abs(by_name["cross-replica 128k, pool on"]["ours"] - 0.605) < 0.06
    assert abs(by_name["session 128k alternating, change %"]["ours"] + 44.61) < 4.5
    assert result.params["blocks"] == ["off", "on", "on", "off"]
    doc = result.to_json()
    assert {"name", "ours", "study", "rel_error"} <= set(doc["comparisons"][0])
    assert len(doc["comparisons"]) == 12


def _check_contract(doc: dict[str, object], swept: bool = False) -> None:
    assert {"scenario", "params", "rows"} <= set(doc)
    rows = doc["rows"]
    assert isinstance(rows, list) and rows
    for row in rows:
        assert set(CONTRACT) <= set(row), row
        assert row["pool"] in ("on", "off")
        if swept:
            assert "load" in row
        assert all(not isinstance(v, dict) for v in row.values())  # flat


def test_json_contract_of_every_scenario(tmp_path: Path) -> None:
    results = [
        (scenarios.cross_replica(STUDY_27B, reps=1), False),
        (scenarios.sessions(STUDY_27B, reps=1), False),
        (scenarios.load(TINY, replicas=2, loads=(10, 40), policies=["round_robin", "fixed"],
                        duration_s=30.0, mix=SMALL_MIX), True),
        (scenarios.pool_pressure(TINY, replicas=2, load=20, pool_gib=(0.004, 0.001),
                                 policies=["least_loaded"], duration_s=30.0, mix=SMALL_MIX), True),
    ]
    for result, swept in results:
        path = tmp_path / f"{result.scenario}.json"
        write_json(result, path)
        _check_contract(json.loads(path.read_text()), swept)
        plot(result, tmp_path / f"{result.scenario}.png")
        assert (tmp_path / f"{result.scenario}.png").stat().st_size > 1000
        assert "| policy |" in markdown(result)


def test_trace_scenario_contract_and_oracle_twin() -> None:
    lines = [f'{{"timestamp": {i * 50}, "input_length": {600 + 40 * i}, "output_length": 8, '
             f'"hash_ids": {list(range(i % 3, i % 3 + 2))}}}' for i in range(40)]
    result = scenarios.trace(TINY, parse_lines(lines), replicas=2, policies=["prefix_affinity"],
                             oracle=True)
    _check_contract(result.to_json(), swept=True)
    labels = {(r["policy"], r["pool"]) for r in result.rows}
    assert ("prefix_affinity+oracle", "on") in labels and ("prefix_affinity", "off") in labels
    assert all(r["n"] == 40 and r["sim_requests_per_s"] for r in result.rows)


def _load_records(seed: int) -> list[tuple[str, str, float]]:
    from sim.des.workload import poisson_sessions

    run = run_arm(TINY, 3, SimArm("least_loaded", True),
                  lambda rng: poisson_sessions(rng, 0.5, 60.0, SMALL_MIX, TINY.chunk_tokens), seed)
    return [(r.session, r.replica, r.ttft_s) for r in run.records]


def test_runs_are_deterministic_by_seed() -> None:
    assert _load_records(7) == _load_records(7)
    assert _load_records(7) != _load_records(8)


class Recorder(BasePolicy):
    """Sticks every request to r0 and logs the hooks, in order."""

    name: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        self.seen: list[RequestView] = []
        self.log: list[str] = []

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        self.seen.append(request)
        self.log.append(f"choose {request.request_id} in_flight={replicas[0].in_flight}")
        return Decision(replicas[0].id, "test")

    def dispatched(self, request: RequestView, decision: Decision) -> None:
        self.log.append(f"dispatched {request.request_id}")

    def observe(self, outcome: Outcome) -> None:
        assert outcome.ttft_s is not None and outcome.ttft_s > 0
        self.log.append(f"observe {outcome.phase} {outcome.request.request_id}")


def _doc(n: int) -> SessionWorkload:
    keys = KeyAlloc()
    return SessionWorkload([prefix_chain(keys, random.Random(0), "d", 512, TINY.chunk_tokens,
                                         turns=n)])


def test_hooks_run_like_the_proxy_and_the_index_learns_on_completion() -> None:
    cluster = Cluster(TINY, 2, pool_on=True)
    policy = Recorder()
    records = Run(cluster, policy, _doc(2)).execute()
    assert policy.log == [
        "choose d/0 in_flight=0", "dispatched d/0", "observe first_token d/0",
        "observe done d/0",
        "choose d/1 in_flight=0", "dispatched d/1", "observe first_token d/1",
        "observe done d/1"]
    first, second = policy.seen
    assert first.residency.gpu == {} and first.residency.pool == 0
    assert second.residency.gpu == {"r0": 32} and second.residency.pool == 32
    assert second.last_replica == "r0"
    assert records[1].gpu_hit_tokens == 512  # the whole document; the question is new


def test_the_policy_sees_the_index_not_a_restart_it_was_not_told_about() -> None:
    cluster = Cluster(TINY, 2, pool_on=False)
    Run(cluster, Recorder(), _doc(1)).execute()
    # An engine restart (a fresh model: empty GPU cache and queue); the router is not told.
    cluster.models["r0"] = ReplicaModel("r0", TINY, cluster.pool)
    policy = Recorder()
    [rec] = Run(cluster, policy, _doc(1)).execute()
    assert policy.seen[0].residency.gpu == {"r0": 32}  # stale belief
    assert rec.gpu_hit_tokens == 0  # ground truth: a full recompute

    oracle = Cluster(TINY, 2, pool_on=False, oracle=True)
    Run(oracle, Recorder(), _doc(1)).execute()
    oracle.models["r0"] = ReplicaModel("r0", TINY, oracle.pool)
    seer = Recorder()
    Run(oracle, seer, _doc(1)).execute()
    assert seer.seen[0].residency.gpu == {}


def test_a_prefix_in_flight_is_known_from_its_dispatch_not_from_the_index() -> None:
    # Two asks of one document arriving together: the index learns the first's blocks only
    # when it completes, but the router's own dispatch (router.in_flight) shows them on
    # their way into r0, as Locator.residency does.
    keys = KeyAlloc()
    spec = prefix_chain(keys, random.Random(0), "d", 512, TINY.chunk_tokens)
    twin = prefix_chain(KeyAlloc(), random.Random(0), "e", 512, TINY.chunk_tokens)
    policy = Recorder()
    cluster = Cluster(TINY, 2, pool_on=True)
    Run(cluster, policy, SessionWorkload([spec, twin], starts=[0.0, 0.001])).execute()
    assert policy.seen[0].residency.gpu == {}
    assert policy.seen[1].residency.gpu == {"r0": 32} and policy.seen[1].residency.pool == 0
    assert policy.log[2] == "choose e/0 in_flight=1"
    assert len(cluster.router.dispatches) == 0  # every dispatch settled at its completion
