"""``locality``'s load-aware charge by Little's law (``sojourn_arrivals_s``) and the
dispatch rate it reads (``policies.dispatch_rate``)."""

from __future__ import annotations

import math

import pytest
from test_ties import BLOCKS, _copy_or_wait, reps, req

from policies.base import Decision, Outcome, ReplicaView
from policies.dispatch_rate import DispatchRate
from policies.locality import Locality, LocalityConfig


def test_a_steady_stream_reads_its_rate_from_the_first_seconds_and_fades_after() -> None:
    rates = DispatchRate(10.0)
    assert rates.rate("a", 0.0) == math.inf  # nothing told yet
    for i in range(20):  # 4 a second for 5 s: half the time constant
        rates.add("a", i / 4)
    assert rates.rate("a", 5.0) == pytest.approx(4.0, rel=0.15)
    assert rates.rate("b", 5.0) == 0.0
    assert rates.rate("a", 60.0) < 0.05  # stopped 55 s ago


def _served(policy: Locality, n: int, gap_s: float) -> None:
    """``n`` hits on a's prefix, one every ``gap_s``, each answered as predicted before
    the next: a's dispatch rate is ``1 / gap_s`` and its queue empty."""
    for i in range(n):
        now = i * gap_s
        view = req(f"h{i}", 1636, gpu={"a": BLOCKS}, session=f"h{i}", now=now)
        ttft = policy.estimate(view, reps("a")[0]).ttft_s
        decision = Decision("a", "gpu-hit")
        policy.dispatched(view, decision)
        policy.observe(Outcome(view, decision, True, ttft_s=ttft, total_s=ttft + 0.01,
                               at=now + ttft + 0.01, prompt_tokens=1636, cached_tokens=1536))


def test_a_queue_at_light_load_is_charged_for_the_arrivals_it_will_delay() -> None:
    """One hit of ours queued on a, which holds the prefix; b idle. Charged as if the
    queue now were the requests that will queue behind the new one (the charge's
    reading before), the hit is copied to b. At one request every 2 s (about 0.1 of a
    replica's capacity), Little's law says about 0.25 will arrive while it waits and is
    served: the queue is a moment's, and the hit stays with its prefix (the vLLM pair's
    copies at 8 req/s were made behind 1-2 queued hits). At one every 0.3 s (about 0.9)
    the queue is the load's, and the copy is made either way."""
    def decide(sojourn_s: float, gap_s: float, shared: bool = False) -> str:
        policy = Locality(LocalityConfig(calibrate=False, untrusted_ties=False,
                                         sojourn_arrivals_s=sojourn_s))
        n = int(60 / gap_s)
        _served(policy, n, gap_s)
        if shared:  # an engine held another router's request: our rate is not its
            busy = [ReplicaView(id="a", url="a"), ReplicaView(id="b", url="b", running=2.0)]
            view = req("o", 1636, session="o", now=n * gap_s)
            policy.dispatched(view, policy.choose(view, busy))  # recorded as dispatched
        return _copy_or_wait(policy, queued=1, now=n * gap_s)

    assert decide(10.0, gap_s=2.0) == "a"
    assert decide(0.0, gap_s=2.0) == "b"  # ``locality@sojourn_arrivals_s=0``: as before
    assert decide(10.0, gap_s=0.3) == "b"
    assert decide(10.0, gap_s=2.0, shared=True) == "b"
