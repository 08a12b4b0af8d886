"""The single name -> policy map. ``create(name, options)`` builds a fresh policy object.

Policies are stateful (cursors, session memory, calibration), so each router, simulator
run or A/B arm gets its own instance.

The map is derived from one list, ``POLICY_CLASSES``. Each class builds itself from
options (``BasePolicy.from_options``): by default ``options`` override fields of its typed
config (``config_cls``), coerced to the field's declared type by ``policies.options``
(``{"stay_margin": "0.3"}`` -> 0.3); an unknown field, or any option for a policy without
a config, is an error. ``split`` takes its arms instead: ``{"spec": "A=fixed:50,..."}`` or
the JSON form (``policies.split``). Every bad option surfaces as ``BadPolicyOptions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.affinity_window import AffinityWindow
from policies.alternating import Alternating
from policies.base import BasePolicy, Policy
from policies.fixed import Fixed
from policies.least_loaded import LeastLoaded
from policies.load_aware import LoadAware
from policies.locality import Locality
from policies.prefix_affinity import PrefixAffinity
from policies.round_robin import RoundRobin
from policies.split import Split

POLICY_CLASSES: tuple[type[BasePolicy], ...] = (
    RoundRobin, LeastLoaded, Fixed, Alternating, PrefixAffinity, AffinityWindow, LoadAware,
    Locality, Split,
)
_BY_NAME: dict[str, type[BasePolicy]] = {cls.name: cls for cls in POLICY_CLASSES}


class UnknownPolicy(KeyError):
    pass


class BadPolicyOptions(ValueError):
    pass


def names() -> list[str]:
    """Policies that run with no options (what demos sweep); ``split`` needs a spec."""
    return sorted(n for n, cls in _BY_NAME.items() if not cls.needs_options)


def all_names() -> list[str]:
    """Every registered policy: ``names()``, then those that need options."""
    return [*names(), *sorted(n for n, cls in _BY_NAME.items() if cls.needs_options)]


def create(name: str, options: Mapping[str, Any] | None = None) -> Policy:
    try:
        cls = _BY_NAME[name]
    except KeyError:
        raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(all_names())}") from None
    try:
        return cls.from_options(options or {}, create)
    except (UnknownPolicy, BadPolicyOptions):
        raise  # a nested policy's (a split arm's) own error, already named
    except ValueError as exc:
        raise BadPolicyOptions(f"{name}: {exc}") from None


def reweight(policy: Policy, weights: Mapping[str, float]) -> tuple[Policy, dict[str, Any]]:
    """A policy with new arm weights (``Split.with_weights``: the same arm objects) and the
    options that rebuild it; ``BadPolicyOptions`` when it has no weights or an arm is
    unknown."""
    with_weights = getattr(policy, "with_weights", None)
    if with_weights is None:
        raise BadPolicyOptions(f"the active policy {policy.name!r} has no arm weights")
    try:
        new: Policy = with_weights(weights)
    except ValueError as exc:
        raise BadPolicyOptions(f"{policy.name}: {exc}") from None
    return new, dict(getattr(new, "options", dict)())
