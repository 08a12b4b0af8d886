"""Settings precedence: default < config file < env < CLI, typed coercion, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.cli import build_parser
from router.settings import Settings, SettingsError, load_settings


def test_precedence(tmp_path: Path) -> None:
    cfg = tmp_path / "lmroute.toml"
    cfg.write_text('backends = ["http://f:1"]\npolicy = "fixed"\nport = 9000\nmax-attempts = 5\n')
    env = {"LMROUTE_PORT": "9001", "LMROUTE_POLICY": "alternating", "UNRELATED": "x"}
    cli = vars(build_parser().parse_args(["serve", "--port", "9002"]))
    s = load_settings(cli, env, cfg)
    assert s.port == 9002 and s.policy == "alternating" and s.max_attempts == 5
    assert s.backends == ("http://f:1",)
    assert load_settings({}, {}, None) == Settings()


def test_env_lists_and_cli_repeats(tmp_path: Path) -> None:
    env = {"LMROUTE_BACKENDS": "http://a:1, http://b:2"}
    assert load_settings({}, env).backends == ("http://a:1", "http://b:2")
    cli = vars(build_parser().parse_args(["serve", "--backend", "http://c", "--backend", "http://d"]))
    assert load_settings(cli, env).backends == ("http://c", "http://d")


def test_json_config_and_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text('{"max_body_bytes": 10}')
    assert load_settings({}, {}, cfg).max_body_bytes == 10
    cfg.write_text('{"colour": "red"}')
    with pytest.raises(SettingsError, match="colour"):
        load_settings({}, {}, cfg)
    with pytest.raises(SettingsError, match="port"):
        load_settings({}, {"LMROUTE_PORT": "eighty"})


def test_split_setting_is_the_split_policys_spec() -> None:
    from policies.registry import BadPolicyOptions
    from router.app import create_app

    backends = ("http://127.0.0.1:9", "http://127.0.0.1:10")
    app = create_app(Settings(backends=backends, policy="split",
                              split="A=fixed:50,B=round_robin:50"))
    assert app is not None
    # A --split beside a policy that is not a split is a mistake to report, not to ignore.
    with pytest.raises(BadPolicyOptions, match="spec"):
        create_app(Settings(backends=backends, policy="locality", split="A=fixed:50,B=round_robin:50"))
