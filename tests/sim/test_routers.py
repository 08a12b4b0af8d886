"""Several routers behind a plain load balancer: what each one knows, and what it does not.

Real clusters, policies and workloads throughout; a router's knowledge is read from its own
objects (index, session memory, policy state) after or during a run.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from policies.base import Policy
from policies.registry import create
from sim.des.cluster import Cluster
from sim.des.simulation import Record, Run
from sim.des.workload import KeyAlloc, SessionMix, SessionSpec, SessionWorkload, prefix_chain
from sim.experiments.arms import SimArm, run_arm
from sim.replica.profiles import TINY

SMALL_MIX = SessionMix(system_tokens=32, first_tokens=(64, 512), added_tokens=(16, 64),
                       output_tokens=(4, 16), think_s=1.0)


def _docs(n: int, tokens: int, turns: int = 1) -> list[SessionSpec]:
    keys, rng = KeyAlloc(), random.Random(0)
    return [prefix_chain(keys, rng, f"d{i}", tokens, TINY.chunk_tokens, turns=turns)
            for i in range(n)]


def _policies(name: str, n: int) -> list[Policy]:
    return [create(name) for _ in range(n)]


def test_each_router_index_holds_only_the_chains_it_served() -> None:
    # 12 small documents (4 blocks each: no index or cache ever evicts), one ask each.
    docs = _docs(12, 64)
    cluster = Cluster(TINY, 3, pool_on=True, routers=4, balancer="round-robin")
    workload = SessionWorkload(docs, starts=[0.5 * i for i in range(12)])
    records = Run(cluster, _policies("least_loaded", 4), workload).execute()
    assert {r.router for r in records} == {0, 1, 2, 3}
    chains = {d.session: d.turns[0].chain for d in docs}
    for rec in records:
        for router in cluster.routers:
            seen = router.index.lookup_now(chains[rec.session])
            if router.number == rec.router:
                assert seen.gpu == {rec.replica: 4} and seen.pool == 4
            else:  # in the shared pool and on a GPU, yet unknown to this router
                assert seen.gpu == {} and seen.pool == 0


def test_a_shared_index_shows_every_router_what_any_router_served() -> None:
    # The --index redis:// deployment: one index, written by the router that served.
    docs = _docs(12, 64)
    cluster = Cluster(TINY, 3, pool_on=True, routers=4, balancer="round-robin",
                      shared_index=True)
    workload = SessionWorkload(docs, starts=[0.5 * i for i in range(12)])
    records = Run(cluster, _policies("least_loaded", 4), workload).execute()
    chains = {d.session: d.turns[0].chain for d in docs}
    assert len({id(r.index) for r in cluster.routers}) == 1
    for rec in records:
        for router in cluster.routers:
            seen = router.index.lookup_now(chains[rec.session])
            assert seen.gpu == {rec.replica: 4} and seen.pool == 4
        # session memory stays each router's own
        assert [r.sessions.last(rec.session) is not None for r in cluster.routers].count(True) == 1


def test_round_robin_takes_the_routers_in_turn() -> None:
    cluster = Cluster(TINY, 2, pool_on=False, routers=3, balancer="round-robin")
    records = Run(cluster, _policies("least_loaded", 3), SessionWorkload(_docs(7, 64))).execute()
    assert [r.router for r in sorted(records, key=lambda r: r.arrival)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_session_spreads_over_routers_and_each_remembers_only_its_own_turns() -> None:
    # 12 turns over 16 routers: at least 4 routers never see the session.
    [doc] = _docs(1, 128, turns=12)
    cluster = Cluster(TINY, 3, pool_on=False, routers=16, rng=random.Random(5))
    records = Run(cluster, _policies("alternating", 16), SessionWorkload([doc])).execute()
    assert len({r.router for r in records}) > 1  # no session affinity at the balancer
    for router in cluster.routers:
        own = [r for r in records if r.router == router.number]
        expected = own[-1].replica if own else None
        assert router.sessions.last("d0") == expected


def test_locality_queues_count_only_the_router_own_requests() -> None:
    # A burst: 8 asks within 1 ms, none reaching its first token (a prefill takes ~50 ms).
    docs = _docs(8, 512)
    cluster = Cluster(TINY, 2, pool_on=False, routers=2, rng=random.Random(1))
    policies = _policies("locality", 2)
    workload = SessionWorkload(docs, starts=[1e-4 * i for i in range(8)])
    run = Run(cluster, policies, workload)
    cluster.loop.schedule(run.arrivals(workload.initial(0.0)))
    cluster.loop.run(until=0.001)
    counts = [sum(router.in_flight.values()) for router in cluster.routers]
    assert sum(counts) == 8 and min(counts) > 0
    for router, policy in zip(cluster.routers, policies, strict=True):
        queued = policy.describe()["queued"]
        assert sum(queued.values()) == sum(router.in_flight.values())
        assert {rid: n for rid, n in queued.items() if n} == {
            rid: n for rid, n in router.in_flight.items() if n}
    # The engines report everyone's queue; each router's own count is only part of it.
    engine = sum(m.waiting(0.001) + m.running(0.001) for m in cluster.models.values())
    assert engine == 8 > max(counts)
    cluster.loop.run()
    assert len(run.records) == 8


def _load(seed: int, routers: int, scrape: float = 0.0) -> list[Record]:
    from sim.des.workload import poisson_sessions

    return run_arm(TINY, 3, SimArm("locality", True),
                   lambda rng: poisson_sessions(rng, 0.5, 60.0, SMALL_MIX, TINY.chunk_tokens),
                   seed, routers=routers, scrape_interval_s=scrape).records


def test_several_routers_are_deterministic_by_seed_and_replay_the_same_workload() -> None:
    a = _load(7, 4, scrape=2.0)
    assert a == _load(7, 4, scrape=2.0)
    assert [r.router for r in a] != [r.router for r in _load(8, 4, scrape=2.0)]
    assert len({r.router for r in a}) == 4
    # The balancer draws from its own generator: the sessions' first arrivals do not move.
    def firsts(records: list[Record]) -> list[tuple[str, float]]:
        return sorted((r.session, r.arrival) for r in records if r.turn == 0)

    assert firsts(a) == firsts(_load(7, 1))


def test_a_long_scrape_interval_shows_stale_waiting() -> None:
    docs = _docs(6, 512)
    workload = SessionWorkload(docs, starts=[1e-4 * i for i in range(6)])
    stale = Cluster(TINY, 2, pool_on=False, scrape_interval_s=1.0)
    fresh = Cluster(TINY, 2, pool_on=False)
    for cluster in (stale, fresh):
        run = Run(cluster, create("least_loaded"), workload)
        cluster.loop.schedule(run.arrivals(workload.initial(0.0)))
        cluster.loop.run(until=0.001)
    truth = [float(m.waiting(0.001)) for m in stale.models.values()]
    assert sum(truth) > 0
    # The only scrape so far was at t=0, before the first admission: empty queues.
    assert [v.waiting for v in stale.router.replica_views(0.001)] == [0.0, 0.0]
    assert [v.waiting for v in fresh.router.replica_views(0.001)] == truth
    # In-flight is the router's own count: never stale.
    assert [v.in_flight for v in stale.router.replica_views(0.001)] == [
        v.in_flight for v in fresh.router.replica_views(0.001)]
    # The next scrape (t=1.0) reads the engines as they are then.
    later = [(float(m.running(1.0)), float(m.waiting(1.0))) for m in stale.models.values()]
    assert [(v.running, v.waiting) for v in stale.router.replica_views(1.0)] == later


def test_a_stale_scrape_counts_our_own_ended_requests_as_ours() -> None:
    """One router: whatever a scrape up to a second old saw at the engines was its own.
    Compared with its in-flight count now (replies have ended since) the scrape shows
    requests of "other routers"; compared with its count when the scrape was read, none."""
    docs = _docs(12, 2048, turns=2)  # ~0.25 s prefills, one started every 0.3 s
    workload = SessionWorkload(docs, starts=[0.3 * i for i in range(12)])
    cluster = Cluster(TINY, 2, pool_on=False, scrape_interval_s=1.0)
    run = Run(cluster, create("least_loaded"), workload)
    cluster.loop.schedule(run.arrivals(workload.initial(0.0)))
    phantom = 0.0
    for step in range(1, 80):
        cluster.loop.run(until=0.05 * step)
        for v in cluster.router.replica_views(0.05 * step):
            assert v.others == 0.0
            phantom += max(0.0, v.running + v.waiting - v.in_flight)
    assert phantom > 0  # the comparison with the count now would have seen some


def test_scrapes_are_staggered_across_routers() -> None:
    cluster = Cluster(TINY, 1, pool_on=False, routers=4, scrape_interval_s=2.0)
    assert [r.last_scrape_time(3.0) for r in cluster.routers] == [2.0, 2.5, 3.0, 1.5]


def test_one_router_is_the_single_router_path() -> None:
    def records(cluster: Cluster, policy: Policy | list[Policy]) -> list[Record]:
        return Run(cluster, policy, SessionWorkload(_docs(6, 256, turns=3))).execute()

    old = records(Cluster(TINY, 2, pool_on=True), create("locality"))
    explicit = records(Cluster(TINY, 2, pool_on=True, routers=1, scrape_interval_s=0.0,
                               balancer="round-robin", rng=random.Random(99)),
                       [create("locality")])
    assert old == explicit and {r.router for r in old} == {0}


def test_oracle_residency_is_shared_truth_for_every_router() -> None:
    [doc] = _docs(1, 64)
    cluster = Cluster(TINY, 2, pool_on=False, oracle=True, routers=3)
    [rec] = Run(cluster, _policies("least_loaded", 3), SessionWorkload([doc])).execute()
    for router in cluster.routers:
        assert router.residency(doc.turns[0].chain, 10.0).gpu == {rec.replica: 4}


def test_each_router_needs_its_own_policy() -> None:
    cluster = Cluster(TINY, 2, pool_on=False, routers=2)
    shared = create("least_loaded")
    workload = SessionWorkload(_docs(1, 64))
    with pytest.raises(ValueError, match="one per router"):
        Run(cluster, shared, workload)
    with pytest.raises(ValueError, match="its own policy"):
        Run(cluster, [shared, shared], workload)
    with pytest.raises(ValueError, match="balancer"):
        Cluster(TINY, 2, pool_on=False, balancer="sticky")


def test_a_heterogeneous_fleet_gives_named_replicas_their_own_physics() -> None:
    slow = dataclasses.replace(TINY, name="tiny-slow", prefill_token_s=TINY.prefill_token_s * 2)
    cluster = Cluster(TINY, 3, pool_on=True, replica_profiles={"r0": slow})
    assert [cluster.models[r].profile.name for r in cluster.ids] == ["tiny-slow", "tiny", "tiny"]
    with pytest.raises(ValueError, match="r9"):
        Cluster(TINY, 3, pool_on=True, replica_profiles={"r9": slow})
