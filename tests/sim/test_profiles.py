"""Profile loading: built-in TOML files, partial files over a base, JSON and TOML, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sim.replica.profiles import STUDY_27B, TINY, ProfileError, builtin_names, load_profile


def test_builtin_names_load_the_shipped_files() -> None:
    assert {"study-27b", "tiny"} <= set(builtin_names())
    study = load_profile("study-27b")
    assert study == STUDY_27B
    assert study.chunk_tokens == 1568 and study.bytes_per_token == 32 * 1024
    assert study.gpu_kv_bytes == 64 << 30 and study.pool_bytes == 256 << 30
    assert study.prefill_token_s == 1.2567e-4 and study.tpot_context_s == 6.8e-9
    assert load_profile("tiny") == TINY and TINY.gpu_capacity_blocks == 64


def test_partial_toml_inherits_from_its_base(tmp_path: Path) -> None:
    path = tmp_path / "fast.toml"
    path.write_text('name = "fast"\nbase = "tiny"\ntpot_s = 0.0005\n')
    assert load_profile(str(path)) == replace(TINY, name="fast", tpot_s=0.0005)
    default_base = tmp_path / "slow.toml"
    default_base.write_text("load_bytes_per_s = 5e9\n")
    assert load_profile(str(default_base)) == replace(STUDY_27B, load_bytes_per_s=5e9)


def test_json_file_with_every_key(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    fields = {f: getattr(TINY, f) for f in TINY.__slots__}  # type: ignore[attr-defined]
    path.write_text(json.dumps({**fields, "name": "j", "base": "no-such-base"}))
    assert load_profile(str(path)) == replace(TINY, name="j")


@pytest.mark.parametrize(("text", "key"), [
    ("chunk_size = 16\n", "chunk_size"),            # unknown key
    ('tpot_s = "fast"\n', "tpot_s"),                # wrong type
    ("chunk_tokens = 15.5\n", "chunk_tokens"),      # not an integer
    ("prefill_fixed_s = -0.1\n", "prefill_fixed_s"),  # negative
    ("load_bytes_per_s = 0\n", "load_bytes_per_s"),   # zero divisor
    ("pool_bytes = true\n", "pool_bytes"),          # a bool is not a number
    ('base = "nope"\n', "base"),                    # unknown base
    ("queued_fixed_share = 1.5\n", "queued_fixed_share"),  # a share above 1
])
def test_bad_keys_and_values_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=key):
        load_profile(str(path))


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n")
    with pytest.raises(ProfileError, match=r"broken\.toml"):
        load_profile(str(broken))
    with pytest.raises(ProfileError, match="not found"):
        load_profile(str(tmp_path / "missing.json"))
    with pytest.raises(ProfileError, match="built-in"):
        load_profile("no-such-profile")


def test_cli_prints_a_profile_error_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("tpot_s = -1\n")
    done = subprocess.run([sys.executable, "-m", "router.cli", "sim", "cross-replica",
                           "--profile", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "tpot_s" in done.stderr and "Traceback" not in done.stderr
