"""The single name -> policy map. ``create(name)`` builds a fresh policy object.

Policies are stateful (cursors, session memory, calibration), so each router, simulator
run or A/B arm gets its own instance.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.alternating import Alternating
from policies.base import Policy
from policies.fixed import Fixed
from policies.least_loaded import LeastLoaded
from policies.locality import Locality
from policies.prefix_affinity import PrefixAffinity
from policies.round_robin import RoundRobin

POLICIES: dict[str, Callable[[], Policy]] = {
    RoundRobin.name: RoundRobin,
    LeastLoaded.name: LeastLoaded,
    Fixed.name: Fixed,
    Alternating.name: Alternating,
    PrefixAffinity.name: PrefixAffinity,
    Locality.name: Locality,
}


class UnknownPolicy(KeyError):
    pass


def names() -> list[str]:
    return sorted(POLICIES)


def create(name: str) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(names())}") from None
    return factory()
