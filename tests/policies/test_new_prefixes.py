"""``NewPrefixes``: new prefixes placed lately, and the readers a new prefix is expected
to have, learnt from the share of prompts that found their prefix held."""

from __future__ import annotations

import math

import pytest

from policies.new_prefixes import MAX_READERS, WARM_ALPHA, NewPrefixes


def test_counts_decay_with_the_time_constant() -> None:
    placed = NewPrefixes(10.0)
    placed.add("a", 0.0, blocks=6, held=False, work=0.5)
    placed.add("a", 0.0, blocks=6, held=True, work=0.1)  # a hit: work, no new prefix
    prefixes, work = placed.of("a", 10.0)
    assert prefixes == pytest.approx(math.exp(-1))
    assert work == pytest.approx(0.6 * math.exp(-1))
    assert placed.of("b", 10.0) == (0.0, 0.0)


def test_readers_follow_the_warm_share() -> None:
    """Every prompt a new prefix: the share falls from 1 by ``WARM_ALPHA`` a prompt; nine
    in ten warm for long: about nine readers a prefix."""
    placed = NewPrefixes(60.0)
    assert placed.readers() == MAX_READERS  # nothing learnt: assume prefixes are read
    placed.add("a", 0.0, blocks=6, held=False, work=0.0)
    assert placed.warm_share == pytest.approx(1 - WARM_ALPHA)
    for i in range(2000):
        placed.add("a", 0.0, blocks=6, held=i % 10 != 0, work=0.0)
    assert 7.0 < placed.readers() < 12.0  # 0.9 / 0.1, give or take the last prompts
    assert placed.committed("a", 2, 0.0) == pytest.approx(2 + placed.of("a", 0.0)[0] * placed.readers())


def test_a_prompt_shorter_than_a_block_is_no_evidence() -> None:
    placed = NewPrefixes(60.0)
    for _ in range(50):
        placed.add("a", 0.0, blocks=0, held=False, work=0.1)
    assert placed.warm_share == 1.0
    prefixes, work = placed.of("a", 0.0)
    assert prefixes == 0.0
    assert work == pytest.approx(5.0)
