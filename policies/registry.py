"""The single name -> policy map. ``create(name, options)`` builds a fresh policy object.

Policies are stateful (cursors, session memory, calibration), so each router, simulator
run or A/B arm gets its own instance.

``options`` override fields of the policy's typed config (``CONFIGS``), coerced to the
type of the field's default (``{"stay_margin": "0.3"}`` -> 0.3); an unknown field, or any
option for a policy without a config, is an error. ``split`` takes its arms instead:
``{"spec": "A=fixed:50,B=locality:50"}`` or the JSON form (``policies.split``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from policies.alternating import Alternating
from policies.base import Policy
from policies.fixed import Fixed
from policies.least_loaded import LeastLoaded
from policies.locality import Locality, LocalityConfig
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.round_robin import RoundRobin
from policies.split import Split, SplitSpecError

POLICIES: dict[str, Callable[[], Policy]] = {
    RoundRobin.name: RoundRobin,
    LeastLoaded.name: LeastLoaded,
    Fixed.name: Fixed,
    Alternating.name: Alternating,
    PrefixAffinity.name: PrefixAffinity,
    Locality.name: Locality,
}

# Policies with a typed config: name -> (config class, factory taking the config).
CONFIGS: dict[str, tuple[type[Any], Callable[[Any], Policy]]] = {
    Locality.name: (LocalityConfig, Locality),
    PrefixAffinity.name: (PrefixAffinityConfig, PrefixAffinity),
}


class UnknownPolicy(KeyError):
    pass


class BadPolicyOptions(ValueError):
    pass


def names() -> list[str]:
    """Policies that run with no options (what demos sweep); ``split`` needs a spec."""
    return sorted(POLICIES)


def _coerce(name: str, key: str, default: Any, value: Any) -> Any:
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "on", "off"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "on")
            return bool(value)
        if isinstance(default, int | float):
            return type(default)(value)
    except (TypeError, ValueError):
        raise BadPolicyOptions(f"{name}: option {key}={value!r} is not a "
                               f"{type(default).__name__}") from None
    raise BadPolicyOptions(f"{name}: option {key!r} cannot be set from a spec")


def _configured(name: str, options: Mapping[str, Any]) -> Policy:
    if name not in CONFIGS:
        raise BadPolicyOptions(f"policy {name!r} takes no options (got {sorted(options)})")
    cls, factory = CONFIGS[name]
    base = cls()
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(options) - fields
    if unknown:
        raise BadPolicyOptions(f"{name}: unknown options {sorted(unknown)}; known: {sorted(fields)}")
    changes = {k: _coerce(name, k, getattr(base, k), v) for k, v in options.items()}
    try:
        return factory(dataclasses.replace(base, **changes))
    except ValueError as exc:  # the config's own validation
        raise BadPolicyOptions(f"{name}: {exc}") from None


def create(name: str, options: Mapping[str, Any] | None = None) -> Policy:
    if name == Split.name:
        spec = (options or {}).get("spec", options)
        if not spec:
            raise BadPolicyOptions("policy 'split' needs a split spec (--split)")
        try:
            return Split.from_spec(spec, create)
        except SplitSpecError as exc:
            raise BadPolicyOptions(str(exc)) from None
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(names())}, "
                            f"{Split.name}") from None
    return _configured(name, options) if options else factory()
