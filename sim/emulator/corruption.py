"""The emulator's corrupt-pool fault: which replies that loaded KV from the pool come out wrong.

Modes (``lmroute replica --corrupt-pool MODE``, or ``{"corrupt_pool": MODE}`` on
``POST /_emulator/faults``; ``true`` there is ``all``, ``false`` is ``off``):

- ``all``: every reply whose prefix this replica loaded from the shared pool (the flag's
  first behaviour, kept as the default mode).
- ``load``: only loads made while this replica holds at least ``corrupt_load`` requests in
  prefill (this one included): the study's delay-triggered race, a copy that skipped its
  dependency on the current CUDA stream and fails only when the stream is busy.
- ``position``: only loads whose span reaches past prompt position ``corrupt_position``
  (a bug in large offsets): a request that loads less from the pool comes out right.
- ``replica``: the chunks *this* replica writes to the pool are wrong, so whichever
  replica loads them (this one or a healthy one) answers wrong. The taint travels with
  the chunk in the pool (``SharedPool.taint``/``RedisPool.taint``); a chunk written by a
  healthy replica stays clean.

What "wrong" means is ``sim.emulator.replies``': the logprobs move by more than any healthy
jitter from the first output position, and the greedy tokens from a later one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI reads MODES without loading the engine
    from sim.emulator.engine import TokenSchedule

MODES = ("off", "all", "load", "position", "replica")
DEFAULT_LOAD = 3
DEFAULT_POSITION = 4096


def corrupt_mode(value: Any) -> str:
    """A fault's mode from the CLI or the faults API (``True`` -> ``all``); ``ValueError``."""
    if value is None or value is False:
        return "off"
    if value is True:
        return "all"
    if isinstance(value, str) and value in MODES:
        return value
    raise ValueError(f"corrupt_pool must be one of {', '.join(MODES)} (or true/false), "
                     f"not {value!r}")


@dataclass(frozen=True, slots=True)
class CorruptPool:
    """One replica's corrupt-pool fault (see the module docstring)."""

    mode: str = "off"
    load: int = DEFAULT_LOAD
    position: int = DEFAULT_POSITION

    def corrupts(self, plan: TokenSchedule, engine: Any, active: int) -> bool:
        """Whether this reply comes out wrong; ``active``: requests in prefill here now."""
        if self.mode == "replica" and plan.pool_stored:
            taint = getattr(_pool(engine), "taint", None)
            if taint is not None:
                taint(plan.pool_stored)
        if plan.pool_hit_tokens <= 0:
            return False
        if plan.corrupt or self.mode == "all":
            return True
        if self.mode == "load":
            return active >= self.load
        if self.mode == "position":
            return plan.cached_tokens > self.position
        return _loaded_tainted(plan, engine)


def _loaded_tainted(plan: TokenSchedule, engine: Any) -> bool:
    """Whether a chunk this reply loaded was written by a ``replica``-mode replica (any
    replica checks: the fault is in the writer)."""
    if not plan.pool_loaded:
        return False
    tainted = getattr(_pool(engine), "tainted", None)
    return bool(tainted is not None and tainted(plan.pool_loaded))


def _pool(engine: Any) -> Any:
    """A ``ModelEngine``'s pool (None for other engines, or without a pool)."""
    return getattr(getattr(engine, "model", None), "pool", None)
