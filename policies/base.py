"""The routing seam: what a policy sees, what it decides, and the protocol it implements.

A policy is pure and synchronous. The router (or the simulator) does all I/O first, then
hands the policy an immutable ``RequestView`` and one ``ReplicaView`` per candidate
replica, and gets back a ``Decision``. State a policy keeps (a round-robin cursor, the last
replica of a session, calibrated cost parameters) changes only through the two hooks
``dispatched`` (the request was sent to the chosen replica) and ``observe`` (the request
finished), so the same object runs unchanged in the router and in ``sim/``.

``choose`` never reads a clock or a random source: time arrives as ``RequestView.now``
and randomness is injected at construction.

The views themselves are in ``policies.views`` (compiled with ``locality`` where mypyc
builds it, setup.py); this module re-exports them, so policies import the seam from one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from policies.options import OptionError, config_from_options
from policies.views import (
    ANCHOR_TOKENS,
    DEFAULT_BLOCK_TOKENS,
    EMPTY_RESIDENCY,
    Decision,
    Outcome,
    ReplicaId,
    ReplicaView,
    RequestView,
    Residency,
    SessionKey,
    Tier,
    anchor_key,
)

__all__ = [
    "ANCHOR_TOKENS", "DEFAULT_BLOCK_TOKENS", "EMPTY_RESIDENCY", "BasePolicy", "Decision",
    "NoReplicaAvailable", "Outcome", "Policy", "PolicyFactory", "ReplicaId", "ReplicaView",
    "RequestView", "Residency", "SessionKey", "Tier", "anchor_key",
]


class NoReplicaAvailable(Exception):
    """Raised by ``choose`` when no candidate is healthy and not excluded."""


@runtime_checkable
class Policy(Protocol):
    """A routing policy. ``choose`` is pure; state changes only through the hooks."""

    name: ClassVar[str]

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision: ...

    def dispatched(self, request: RequestView, decision: Decision) -> None: ...

    def observe(self, outcome: Outcome) -> None: ...

    def describe(self) -> dict[str, Any]: ...


PolicyFactory = Callable[[str, Mapping[str, Any] | None], Policy]


class BasePolicy:
    """No-op hooks, the candidate filter and option handling shared by every policy.

    ``config_cls``: the policy's typed config (a dataclass whose fields are its options),
    passed to the constructor; ``None``: the policy takes no options. ``needs_options``:
    the policy cannot run without options (``split``), so sweeps over ``names()`` skip it.
    """

    name: ClassVar[str] = "base"
    config_cls: ClassVar[type[Any] | None] = None
    needs_options: ClassVar[bool] = False

    @classmethod
    def from_options(cls, options: Mapping[str, Any], create: PolicyFactory) -> Policy:
        """A fresh policy from registry options (``create`` builds nested policies).

        Raises ``ValueError`` (``OptionError`` for unknown or uncoercible options)."""
        factory: Callable[..., Policy] = cls
        if cls.config_cls is None:
            if options:
                raise OptionError(f"takes no options (got {sorted(options)})")
            return factory()
        return factory(config_from_options(cls.config_cls, options))

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        raise NotImplementedError

    def dispatched(self, request: RequestView, decision: Decision) -> None:
        return None

    def observe(self, outcome: Outcome) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        """Live parameters for GET /policy (JSON-serialisable)."""
        return {"name": self.name}

    @staticmethod
    def candidates(request: RequestView, replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
        """Healthy replicas not yet tried for this request, in the given order."""
        out = [r for r in replicas if r.healthy and r.id not in request.exclude]
        if not out:
            raise NoReplicaAvailable("no healthy replica left for this request")
        return out
