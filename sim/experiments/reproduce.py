"""The study's design by simulation: OFF-ON-ON-OFF restart blocks, paired statistics.

Design (the study's: 4 restart blocks x 192 measured requests = 768): each block starts
fresh (new replica models, pool, router index and policy objects: a restart) with the pool
off, on, on, off. On 2 replicas a block runs, one request at a time, ``rounds`` (24)
rounds; each round asks a 128k and a 256k document twice under ``alternating`` (the
first ask, on one replica, is warm-up; the second, on the other replica, is measured),
and every ``session_every``-th round (4) also runs four six-turn sessions (32k and 128k
starts under ``fixed`` and under ``alternating``; every turn measured). Per block:
24 x 2 + 6 x 4 x 6 = 192 measured requests.

Pairing: blocks 1 and 2 replay one workload, blocks 3 and 4 another (``random.Random`` of
``(seed, pair)``; sizes jittered by ``jitter``), so every OFF measurement has an ON twin
of the same item; order effects cancel across the two pairs as in the study. Reported:
per-figure medians over the OFF and ON blocks with bootstrap CIs, paired differences, and
``comparisons`` against the study's numbers (``sim.study.STUDY_CROSS``/``STUDY_SESSIONS``):
``rel_error = (ours - study) / |study|`` and, for percentage changes, ``abs_error`` in points.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from policies.base import Policy
from policies.registry import create
from sim.des.cluster import Cluster
from sim.des.simulation import Record, Run
from sim.des.workload import KeyAlloc, SessionSpec, SessionWorkload, prefix_chain, study_session
from sim.experiments.arms import NoProgress, Progress, Result, session_totals
from sim.experiments.stats import group_rows, paired
from sim.experiments.study import STUDY_CROSS, STUDY_SESSIONS
from sim.replica.profiles import Profile

BLOCKS = (False, True, True, False)  # OFF-ON-ON-OFF


def _items(rng: random.Random, profile: Profile, pair: int, rounds: int, session_every: int,
           jitter: float) -> list[tuple[str, SessionSpec]]:
    """(policy, session) in run order; measured flags set per turn by the caller."""
    keys = KeyAlloc()
    chunk = profile.chunk_tokens
    items: list[tuple[str, SessionSpec]] = []
    for r in range(rounds):
        for tokens in STUDY_CROSS:
            items.append(("alternating", prefix_chain(keys, rng, f"p{pair}c{r}-{tokens}", tokens,
                                                      chunk, jitter=jitter,
                                                      tag=f"cross {tokens // 1024}k")))
        if r % session_every == 0:
            for start in STUDY_SESSIONS:
                for policy in ("fixed", "alternating"):
                    items.append((policy, study_session(
                        keys, rng, f"p{pair}s{r}-{start}-{policy}", start, chunk, jitter=jitter,
                        tag=f"session {start // 1024}k {policy}")))
    return items


def _block(profile: Profile, pool_on: bool, items: list[tuple[str, SessionSpec]]) -> list[Record]:
    cluster = Cluster(profile, 2, pool_on=pool_on)
    policies: dict[str, Policy] = {}
    records: list[Record] = []
    for name, spec in items:
        policy = policies.get(name) or policies.setdefault(name, create(name))
        records += Run(cluster, policy, SessionWorkload([spec])).execute()
    # A cross-replica pair's first ask only places the document: not measured.
    return [r for r in records if not (r.tag.startswith("cross") and r.turn == 0)]


def _values(records: list[Record], tag: str) -> list[float]:
    if tag.startswith("cross"):
        return [r.ttft_s for r in records if r.tag == tag]
    totals = session_totals(r for r in records if r.tag == tag)
    return [totals[s] for s in sorted(totals)]


def run_study(profile: Profile, *, seed: int = 0, rounds: int = 24, session_every: int = 4,
              jitter: float = 0.05, progress: Progress | None = None) -> Result:
    progress = progress or NoProgress()
    progress.start(len(BLOCKS), "study blocks")
    per_pair = [_items(random.Random(f"{seed}/{pair}"), profile, pair, rounds, session_every,
                       jitter) for pair in (0, 1)]
    blocks: list[list[Record]] = []
    for b, pool_on in enumerate(BLOCKS):
        blocks.append(_block(profile, pool_on, per_pair[b // 2]))
        progress.advance(f"block {b + 1} pool {'on' if pool_on else 'off'}")
    off = blocks[0] + blocks[3]
    on = blocks[1] + blocks[2]
    nprng = np.random.default_rng(seed)
    rows = group_rows(off + on, ("policy", "pool", "tag"), nprng)
    tags = list(dict.fromkeys(r.tag for r in off))
    figures: dict[str, dict[str, Any]] = {}
    for tag in tags:
        # Pairs in item order: block 1 with block 2, block 4 with block 3.
        before = _values(blocks[0], tag) + _values(blocks[3], tag)
        after = _values(blocks[1], tag) + _values(blocks[2], tag)
        figures[tag] = paired(before, after, nprng)
    comparisons = _comparisons(figures)
    params = {"profile": profile.name, "replicas": 2, "blocks": ["off", "on", "on", "off"],
              "rounds": rounds, "session_every": session_every, "seed": seed, "jitter": jitter,
              "measured_per_block": len(blocks[0]), "measured": sum(len(b) for b in blocks)}
    return Result("study", params, rows, comparisons, extra={"paired": figures})


def _cmp(name: str, ours: float, study: float, points: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "ours": ours, "study": study,
                           "rel_error": (ours - study) / abs(study)}
    if points:
        out["abs_error"] = ours - study
    return out


def _comparisons(figures: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tokens, (off, on) in STUDY_CROSS.items():
        f = figures[f"cross {tokens // 1024}k"]
        out.append(_cmp(f"cross-replica {tokens // 1024}k, pool off", f["median_off"], off))
        out.append(_cmp(f"cross-replica {tokens // 1024}k, pool on", f["median_on"], on))
    for start, (off, on, fixed) in STUDY_SESSIONS.items():
        k = start // 1024
        alt = figures[f"session {k}k alternating"]
        out.append(_cmp(f"session {k}k alternating, pool off", alt["median_off"], off))
        out.append(_cmp(f"session {k}k alternating, pool on", alt["median_on"], on))
        out.append(_cmp(f"session {k}k alternating, change %", alt["change_pct"],
                        100 * (on - off) / off, points=True))
        out.append(_cmp(f"session {k}k fixed, change %",
                        figures[f"session {k}k fixed"]["change_pct"], fixed, points=True))
    return out


def passes(comparisons: Sequence[dict[str, Any]], rel: float = 0.10, fixed_pt: float = 3.0) -> bool:
    """The acceptance rule: times and alternating changes within ``rel``; fixed within points."""
    for c in comparisons:
        if "fixed" in c["name"]:
            if abs(c["ours"]) > fixed_pt:
                return False
        elif abs(c["rel_error"]) > rel:
            return False
    return True
