"""``router.openai_api.lax_bool``: the ``stream`` field read as pydantic's lax ``bool`` (what
vLLM accepts), JSON booleans on their fast path included."""

from __future__ import annotations

from typing import Any

import pytest

from router.openai_api import lax_bool


@pytest.mark.parametrize(("value", "expected"), [
    (True, True), (False, False),
    (1, True), (0, False), (1.0, True), (0.0, False),
    ("true", True), ("false", False), ("yes", True), ("no", False), ("on", True),
    ("off", False), (" T ", True), ("f", False), ("Y", True), ("n", False),
    ("1", True), ("0", False),
    (2, None), (-1, None), (0.5, None), ("maybe", None), ("", None), ([], None),
    ({}, None), ([True], None),
])
def test_lax_bool_reads_what_vllm_reads(value: Any, expected: bool | None) -> None:
    got = lax_bool(value)
    assert got is expected  # a bool, not a truthy int or the value itself
