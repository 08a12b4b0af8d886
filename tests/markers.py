"""Suites that run only when chosen: ``make test-vllm`` (``-m vllm``), ``make test-deploy``
(``-m deploy``). A run without ``-m`` deselects their tests, so a plain ``pytest`` never
reports them as passed or skipped."""

from __future__ import annotations

import pytest


def deselect_unless_chosen(config: pytest.Config, items: list[pytest.Item], marker: str) -> None:
    """Drop the items marked ``marker`` unless the run gave a marker expression."""
    if config.getoption("markexpr"):
        return
    chosen = [i for i in items if i.get_closest_marker(marker) is None]
    if len(chosen) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in chosen])
        items[:] = chosen
