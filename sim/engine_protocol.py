"""What the emulated replica's server asks of an engine: a ``Plan`` per admitted request.

``Engine.admit(token_ids, max_tokens, now)`` plans one request at model time ``now``
(seconds, non-decreasing across calls): when its first token is due (``ttft_s``, queueing
included), the time per output token, how many prompt tokens were cached (and how many of
them came from the shared pool), and an optional callback the server runs when the first
token is due (the model engine publishes its KV events there). ``ConstantEngine`` answers
with fixed times, for API tests; ``sim.engine_adapter.ModelEngine`` runs the replica model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Plan:
    """When a request's tokens are due, in model seconds from admission."""

    ttft_s: float
    tpot_s: float
    cached_tokens: int = 0
    corrupt: bool = False
    pool_hit_tokens: int = 0  # part of cached_tokens loaded from the shared pool
    queue_s: float = 0.0  # part of ttft_s spent waiting for the prefill engine
    on_first_token: Callable[[], None] | None = None  # e.g. publish KV events


class Engine(Protocol):
    """Plans requests; ``now`` is model time (seconds), non-decreasing across calls."""

    def admit(self, token_ids: list[int], max_tokens: int, now: float) -> Plan: ...

    def finish(self, token_ids: list[int], now: float) -> None: ...

    def kv_usage(self) -> float: ...


@dataclass
class ConstantEngine:
    """Fixed TTFT and time per output token: the engine for plain API tests."""

    ttft_s: float = 0.0
    tpot_s: float = 0.0

    def admit(self, token_ids: list[int], max_tokens: int, now: float) -> Plan:
        return Plan(self.ttft_s, self.tpot_s)

    def finish(self, token_ids: list[int], now: float) -> None:
        return None

    def kv_usage(self) -> float:
        return 0.0
