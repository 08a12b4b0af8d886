"""Physics apart from beliefs: a simulation whose profile file differs from the policy's prior.

The replica's physics come from a profile file (here: prefill three times slower than the
study fit); ``locality``'s belief is its own prior (the study fit). The honest run must
start from the wrong prior and learn the difference online; only an arm that says
``+oracle-prior`` is handed the profile's timings.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from policies.cost import STUDY_PRIOR
from policies.locality import Locality
from sim.des.cluster import Cluster
from sim.des.generators import GENERATORS
from sim.des.simulation import Run
from sim.des.workload import SessionMix, poisson_sessions
from sim.experiments.arms import make_policy, parse_policy
from sim.replica.profiles import Profile, load_profile

MIX = SessionMix(system_tokens=1568, first_tokens=(4096, 16384), turns=(2, 3),
                 added_tokens=(128, 512), output_tokens=(8, 32), think_s=5.0)


def _slow_prefill(tmp_path: Path) -> Profile:
    path = tmp_path / "slow-prefill.toml"
    p = STUDY_PRIOR
    path.write_text(
        'base = "study-27b"\nname = "slow-prefill"\n'
        f"prefill_fixed_s = {3 * p.prefill_fixed_s!r}\n"
        f"prefill_token_s = {3 * p.prefill_token_s!r}\n"
        f"prefill_token2_s = {3 * p.prefill_token2_s!r}\n")
    return load_profile(str(path))


def _run(profile: Profile, arm: str) -> Locality:
    policy = make_policy(parse_policy(arm), profile)
    assert isinstance(policy, Locality)
    workload = poisson_sessions(random.Random(3), 0.02, 900.0, MIX, profile.chunk_tokens)
    records = Run(Cluster(profile, 2, pool_on=False), policy, workload).execute()
    assert len(records) > 20
    return policy


def test_the_policy_keeps_its_own_prior_and_learns_the_profile(tmp_path: Path) -> None:
    profile = _slow_prefill(tmp_path)
    assert profile.prefill_token_s == pytest.approx(3 * STUDY_PRIOR.prefill_token_s)
    assert profile.load_fixed_s == STUDY_PRIOR.load_fixed_s  # the rest from base

    honest = _run(profile, "locality")
    assert honest.config.prior == STUDY_PRIOR  # never handed the simulator's profile
    # Every service time came out ~3x the prior's prediction: calibration says so.
    assert 2.7 < float(honest.calibration.as_json()["fleet_scale"]) < 3.3  # type: ignore[arg-type]

    knows = _run(profile, "locality+oracle-prior")
    assert knows.config.prior.prefill_token_s == profile.prefill_token_s
    assert knows.config.prior.source == "profile"
    assert 0.9 < float(knows.calibration.as_json()["fleet_scale"]) < 1.1  # type: ignore[arg-type]


def test_policy_options_reach_the_simulated_policy(tmp_path: Path) -> None:
    prior = tmp_path / "fast.toml"
    prior.write_text(f"prefill_token_s = {STUDY_PRIOR.prefill_token_s / 2!r}\n")
    arm = parse_policy(f"locality@prior={prior}@stay_margin=0.3")
    policy = make_policy(arm, load_profile("study-27b"))
    assert isinstance(policy, Locality)
    assert policy.config.stay_margin == 0.3
    assert policy.config.prior.prefill_token_s == pytest.approx(STUDY_PRIOR.prefill_token_s / 2)
    assert arm.label == f"locality@prior={prior}@stay_margin=0.3"


def test_a_true_prior_stays_true_through_thousands_of_requests() -> None:
    """The study profile under the study prior, on ``docqa`` (four replicas near the knee,
    300 s, ~3,000 requests): nearly every request hits a long cached document, so the
    pool-load term is rarely excited and the linear and attention terms move together.
    The observations match the prior, so every factor must stay at 1 and the model's
    error at 0. When the covariance's variances were clamped one by one, it stopped
    being positive semi-definite once the clamp bound, and the factors ran between their
    bounds (fixed 2.1, linear 0.05, load 20; error at the clip): the policy then trusted
    nothing and kept every session put (``docqa`` mean TTFT 0.63 s instead of 0.55 s)."""
    profile = load_profile("study-27b")
    policy = make_policy(parse_policy("locality"), profile)
    assert isinstance(policy, Locality)
    workload = GENERATORS["docqa"](random.Random(0), 0.8781, 300.0, profile.chunk_tokens)
    records = Run(Cluster(profile, 4, pool_on=True), policy, workload).execute()
    assert len(records) > 2_000
    assert policy.calibration.observations > 2_000
    for factor in policy.calibration.term_scale:
        assert factor == pytest.approx(1.0, rel=0.05)
    assert policy.calibration.error() < 0.02
