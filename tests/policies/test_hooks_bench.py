"""bench/policy_hooks.py drives every policy's three hooks: it must keep running as the
policies change (a hook's new signature or state breaks it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from policy_hooks import per_request_us

from policies.registry import names


@pytest.mark.parametrize("policy", names())
def test_the_hooks_benchmark_times_every_policy(policy: str) -> None:
    choose, dispatched, observe = per_request_us(policy, replicas=3, in_flight=8, n=50,
                                                 rounds=2)
    assert choose > 0 and dispatched >= 0 and observe >= 0
