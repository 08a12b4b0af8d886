"""The locality policy's prior is its own config: ``locality@prior=PATH``."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies import registry
from policies.base import ReplicaView, RequestView
from policies.cost import DEFAULT_PRIOR_FILE, STUDY_PRIOR, PriorError, load_prior


def _predicted(options: dict[str, object]) -> float:
    policy = registry.create("locality", options)
    request = RequestView(request_id="r", model="m", session="s", prompt_tokens=32_768)
    ttft = policy.choose(request, [ReplicaView(id="a", url="a")]).predicted_ttft_s
    assert ttft is not None
    return ttft


def test_the_default_prior_is_the_shipped_file() -> None:
    assert load_prior(DEFAULT_PRIOR_FILE) == STUDY_PRIOR == load_prior()
    assert STUDY_PRIOR.name == "study-27b"
    state = registry.create("locality").describe()
    assert state["config"]["prior"]["source"] == str(DEFAULT_PRIOR_FILE)


@pytest.mark.parametrize("suffix", [".toml", ".json"])
def test_a_prior_file_changes_the_predicted_ttft(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"slow{suffix}"
    path.write_text('{"prefill_token_s": 2.5e-4, "name": "slow"}' if suffix == ".json"
                    else 'name = "slow"\nprefill_token_s = 2.5e-4\n')
    slow = _predicted({"prior": str(path)})
    assert slow > _predicted({}) * 1.5
    prior = registry.create("locality", {"prior": str(path)}).describe()["config"]["prior"]
    assert prior["name"] == "slow" and prior["source"] == str(path)
    # Missing fields keep the study fit.
    assert prior["prefill_fixed_s"] == STUDY_PRIOR.prefill_fixed_s


def test_load_token_s_is_bytes_per_token_over_bandwidth(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("bytes_per_token = 1000\nload_bytes_per_s = 1e6\ntpot_s = 0.01\n")
    assert load_prior(path).load_token_s == pytest.approx(1e-3)


@pytest.mark.parametrize(("text", "named"), [
    ("prefill_tokens = 1\n", "prefill_tokens"),
    ('load_fixed_s = "slow"\n', "load_fixed_s"),
    ("prefill_fixed_s = -1.0\n", "prefill_fixed_s"),
    ("load_bytes_per_s = 0\n", "load_bytes_per_s"),
    ("name = 3\n", "name"),
    ("this is not toml", "TOML"),
])
def test_bad_prior_files_name_the_key(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(registry.BadPolicyOptions, match=named):
        registry.create("locality", {"prior": str(path)})


def test_a_missing_prior_file_is_a_bad_option(tmp_path: Path) -> None:
    with pytest.raises(registry.BadPolicyOptions, match="prior"):
        registry.create("locality", {"prior": str(tmp_path / "absent.toml")})


def test_serve_with_a_bad_prior_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from router.cli import main

    path = tmp_path / "bad.toml"
    path.write_text("nope = 1\n")
    code = main(["serve", "--backend", "http://127.0.0.1:9", "--policy",
                 f"locality@prior={path}"])
    assert code == 2 and "unknown key 'nope'" in capsys.readouterr().err


def test_a_profile_file_with_a_base_reads_as_a_prior(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.toml"
    path.write_text('base = "study-27b"\nname = "my-gpu"\nprefill_token_s = 6.3e-5\n'
                    "load_bytes_per_s = 12e9\ngpu_kv_bytes = 34359738368\n")
    prior = load_prior(path)
    assert prior.prefill_token_s == 6.3e-5
    assert prior.load_token_s == pytest.approx(STUDY_PRIOR.load_token_s * 25 / 12)
    assert prior.prefill_token2_s == STUDY_PRIOR.prefill_token2_s  # from base
    (tmp_path / "bad.toml").write_text('base = "h100"\n')
    with pytest.raises(PriorError, match="'base'"):
        load_prior(tmp_path / "bad.toml")
