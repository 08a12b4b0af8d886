"""The one option coercer (policies.options), shared by policy options and router settings."""

from __future__ import annotations

import pytest

from policies import registry
from policies.options import OptionError, coerce
from router.settings import SettingsError, load_settings


@pytest.mark.parametrize(("raw", "expected"), [
    ("yes", True), ("no", False), ("on", True), ("off", False), ("true", True),
    ("false", False), ("1", True), ("0", False), ("YES", True), (" Off ", False),
    (True, True), (False, False), (1, True), (0, False),
])
def test_booleans(raw: object, expected: bool) -> None:
    assert coerce("calibrate", bool, raw) is expected


@pytest.mark.parametrize("raw", ["maybe", "", 2, 0.5, None])
def test_bad_booleans_name_the_key(raw: object) -> None:
    with pytest.raises(OptionError, match="calibrate"):
        coerce("calibrate", bool, raw)


def test_numbers() -> None:
    assert coerce("warmup", int, "7") == 7 and coerce("warmup", int, 7.0) == 7
    assert coerce("alpha", float, "0.25") == 0.25 and coerce("alpha", float, 1) == 1.0
    for key, typ, raw in (("warmup", int, "x"), ("warmup", int, 1.5), ("warmup", int, True),
                          ("alpha", float, "x"), ("alpha", float, False)):
        with pytest.raises(OptionError, match=key):
            coerce(key, typ, raw)


def test_strings_and_lists() -> None:
    assert coerce("split", str, {"arms": []}) == '{"arms": []}'
    assert coerce("backends", tuple[str, ...], "a, b,") == ("a", "b")
    assert coerce("backends", tuple[str, ...], ["a", "b"]) == ("a", "b")


def test_policy_options_and_settings_agree() -> None:
    for word, expected in (("yes", True), ("off", False)):
        policy = registry.create("locality", {"calibrate": word})
        assert policy.describe()["config"]["calibrate"] is expected
        assert load_settings(env={"LMROUTE_POOL_WRITE_THROUGH": word}).pool_write_through \
            is expected
    with pytest.raises(registry.BadPolicyOptions, match="stay_margin"):
        registry.create("locality", {"stay_margin": "wide"})
    with pytest.raises(SettingsError, match="pool_write_through"):
        load_settings(env={"LMROUTE_POOL_WRITE_THROUGH": "maybe"})


@pytest.mark.parametrize(("key", "raw"), [
    ("noise", "0"), ("noise", "-0.3"), ("noise", "nan"), ("clip", "1"), ("alpha", "0"),
    ("alpha", "1.5"), ("warmup", "0"),
])
def test_locality_refuses_values_its_calibration_cannot_use(key: str, raw: str) -> None:
    """Each would fail later inside a reply's bookkeeping (noise 0 divides by zero at the
    first reply after warm-up); the option is refused where it is set, by name."""
    with pytest.raises(registry.BadPolicyOptions, match=key):
        registry.create("locality", {key: raw})
    assert registry.create("locality", {"noise": "1"}).describe()["config"]["noise"] == 1.0
