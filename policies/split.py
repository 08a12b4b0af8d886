"""``split``: an A/B traffic split. Each session goes to one arm, each arm is a policy.

Assignment: session key ``s`` goes to the arm whose cumulative-weight interval holds

    u(s) = xxh3_64(salt NUL s) / 2**64            (uniform in [0, 1))

so it is sticky per session (every turn of a session sees the same arm, whose policy keeps
its history), identical on several routers with the same spec (no shared state), and
re-drawn for a different ``salt`` (a new experiment reshuffles sessions). Weights are
relative (``50``/``50`` = ``1``/``1``); an arm of weight 0 receives no new sessions.

Delegation: ``choose`` asks the session's arm policy and returns its decision with
``Decision.arm`` set (the reason stays the arm policy's own stable word); ``dispatched`` and
``observe`` go to the arm named in the decision, so a request always reports to the policy
object that chose it, even if the weights changed meanwhile (``with_weights`` builds a new
``Split`` around the same arm objects; the router swaps it in between requests).

Spec (``--split`` / the ``split`` setting), either compact::

    A=fixed:50,B=locality@stay_margin=0.3:50[,salt=exp7]

(``NAME=POLICY[@KEY=VALUE...]:WEIGHT``; ``@KEY=VALUE`` options go to the arm policy's typed
config, values read as JSON scalars, else strings), or JSON (also what a TOML table becomes)::

    {"salt": "exp7", "arms": [{"name": "A", "policy": "fixed", "weight": 50},
                              {"name": "B", "policy": "locality", "weight": 50,
                               "options": {"stay_margin": 0.3}}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import xxhash

from policies.base import (
    BasePolicy,
    Decision,
    Outcome,
    Policy,
    PolicyFactory,
    ReplicaView,
    RequestView,
)

_SCALE = float(1 << 64)


class SplitSpecError(ValueError):
    """A split spec that cannot be parsed or names an arm twice."""


@dataclass(frozen=True, slots=True)
class ArmSpec:
    name: str
    policy: str
    weight: float
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SplitSpec:
    arms: tuple[ArmSpec, ...]
    salt: str = ""

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if len(self.arms) < 1 or len(set(names)) != len(names):
            raise SplitSpecError(f"a split needs distinct arm names, got {names}")
        if any(a.weight < 0 for a in self.arms) or sum(a.weight for a in self.arms) <= 0:
            raise SplitSpecError("arm weights must be >= 0 with a positive sum")


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_policy_ref(text: str) -> tuple[str, dict[str, Any]]:
    """``locality@stay_margin=0.3@calibrate=false`` -> ("locality", {...})."""
    name, *opts = text.strip().split("@")
    options: dict[str, Any] = {}
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep or not key.strip():
            raise SplitSpecError(f"option {opt!r} of {text!r} is not KEY=VALUE")
        options[key.strip()] = _scalar(value.strip())
    if not name.strip():
        raise SplitSpecError(f"no policy name in {text!r}")
    return name.strip(), options


def parse_split(spec: str | Mapping[str, Any]) -> SplitSpec:
    """Parse the compact or the JSON form (see the module docstring)."""
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise SplitSpecError(f"split spec is not valid JSON: {exc}") from None
    if isinstance(spec, Mapping):
        try:
            arms = tuple(ArmSpec(str(a["name"]), str(a["policy"]), float(a.get("weight", 1)),
                                 dict(a.get("options", {}))) for a in spec["arms"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SplitSpecError(f"bad split arm: {exc!r}") from None
        return SplitSpec(arms, str(spec.get("salt", "")))
    out: list[ArmSpec] = []
    salt = ""
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, rest = part.partition("=")
        if not sep:
            raise SplitSpecError(f"arm {part!r} is not NAME=POLICY:WEIGHT")
        if name.strip() == "salt":
            salt = rest.strip()
            continue
        ref, colon, weight = rest.rpartition(":")
        if not colon:
            ref, weight = rest, "1"
        policy, options = parse_policy_ref(ref)
        try:
            out.append(ArmSpec(name.strip(), policy, float(weight), options))
        except ValueError:
            raise SplitSpecError(f"weight {weight!r} of arm {name!r} is not a number") from None
    return SplitSpec(tuple(out), salt)


def unit_hash(salt: str, session: str) -> float:
    """The session's position in [0, 1): uniform, deterministic, the same on every router."""
    return xxhash.xxh3_64_intdigest(f"{salt}\x00{session}".encode()) / _SCALE


@dataclass(slots=True)
class Arm:
    name: str
    policy: Policy
    weight: float


class Split(BasePolicy):
    name: ClassVar[str] = "split"
    needs_options: ClassVar[bool] = True

    def __init__(self, arms: Sequence[Arm], salt: str = "") -> None:
        if not arms or sum(a.weight for a in arms) <= 0 or any(a.weight < 0 for a in arms):
            raise SplitSpecError("a split needs arms with weights >= 0 and a positive sum")
        self.arms = list(arms)
        self.salt = salt
        self._by_name = {a.name: a for a in self.arms}
        total = sum(a.weight for a in self.arms)
        acc = 0.0
        self._bounds: list[tuple[float, Arm]] = []
        for a in self.arms:
            acc += a.weight / total
            self._bounds.append((acc, a))

    @classmethod
    def from_spec(cls, spec: str | Mapping[str, Any] | SplitSpec, create: PolicyFactory) -> Split:
        parsed = spec if isinstance(spec, SplitSpec) else parse_split(spec)
        return cls([Arm(a.name, create(a.policy, a.options), a.weight) for a in parsed.arms],
                   parsed.salt)

    @classmethod
    def from_options(cls, options: Mapping[str, Any], create: PolicyFactory) -> Policy:
        """Registry options: ``{"spec": SPEC}`` (the ``--split`` setting), or the JSON
        form's own keys."""
        spec = options.get("spec", options)
        if not spec:
            raise SplitSpecError("needs a split spec (--split)")
        return cls.from_spec(spec, create)

    def options(self) -> dict[str, Any]:
        """Registry options that rebuild this split (fresh arm policies)."""
        return {"spec": {"salt": self.salt, "arms": [
            {"name": a.name, "policy": a.policy.name, "weight": a.weight} for a in self.arms]}}

    def with_weights(self, weights: Mapping[str, float]) -> Split:
        """A new split over the SAME arm policy objects (their state carries over)."""
        unknown = set(weights) - set(self._by_name)
        if unknown:
            raise SplitSpecError(f"unknown arms {sorted(unknown)}; arms: {list(self._by_name)}")
        return Split([Arm(a.name, a.policy, float(weights.get(a.name, a.weight)))
                      for a in self.arms], self.salt)

    def arm_of(self, session: str) -> Arm:
        u = unit_hash(self.salt, session)
        for bound, arm in self._bounds:
            if u < bound and arm.weight > 0:
                return arm
        # u fell past the last bound by rounding, or into a zero-weight tail: last live arm.
        return [a for a in self.arms if a.weight > 0][-1]

    def choose(self, request: RequestView, replicas: Sequence[ReplicaView]) -> Decision:
        arm = self.arm_of(request.session)
        d = arm.policy.choose(request, replicas)
        return Decision(d.replica, d.reason, d.predicted_ttft_s, arm=arm.name)

    def _arm(self, decision: Decision) -> Arm | None:
        return self._by_name.get(decision.arm)

    def dispatched(self, request: RequestView, decision: Decision) -> None:
        arm = self._arm(decision)
        if arm is not None:
            arm.policy.dispatched(request, decision)

    def observe(self, outcome: Outcome) -> None:
        arm = self._arm(outcome.decision)
        if arm is not None:
            arm.policy.observe(outcome)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "salt": self.salt,
                "arms": [{"name": a.name, "policy": a.policy.name, "weight": a.weight,
                          "state": a.policy.describe()} for a in self.arms]}
