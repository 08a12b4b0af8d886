"""The ``h200-27b`` profile: built from the committed H200 results, loadable, and runnable.

The profile is what ``bench/gpu/fit_profile.py`` makes of ``bench/gpu/results/*.json``
(docs/calibration.md): rebuilding it here must give the shipped file byte for byte, so the
numbers in the profile cannot drift from the measurements they claim to come from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sim.experiments.gauntlet import HARDWARE, hardware_row
from sim.replica.profiles import STUDY_27B, builtin_names, load_profile

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "sim" / "replica" / "profiles" / "h200-27b.toml"


def test_profile_loads_beside_the_study_and_is_faster_where_measured() -> None:
    assert "h200-27b" in builtin_names()
    h200 = load_profile("h200-27b")
    assert h200.name == "h200-27b"
    # the study's deployment: same geometry and capacities
    for key in ("chunk_tokens", "bytes_per_token", "gpu_kv_bytes", "pool_bytes"):
        assert getattr(h200, key) == getattr(STUDY_27B, key)
    # measured: a cold 128k prefill and a 128k pool load are both cheaper than the study's
    assert h200.prefill_s(0, 131072) < STUDY_27B.prefill_s(0, 131072)
    assert h200.pool_load_s(131712) < STUDY_27B.pool_load_s(131712)


def test_the_fit_script_rebuilds_the_shipped_profile(tmp_path: Path) -> None:
    out = tmp_path / "h200.toml"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "fit_profile.py"),
                           "--write", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == SHIPPED.read_text()
    assert "held out" in done.stdout  # the 256k run is predicted, not fitted


def test_sim_study_runs_with_the_profile(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    done = subprocess.run([sys.executable, "-m", "router.cli", "sim", "study", "--profile",
                           "h200-27b", "--json", str(path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "cross-replica 128k, pool on" in done.stdout
    assert path.stat().st_size > 0 and "h200-27b" in json.dumps(json.loads(path.read_text()))


def test_gauntlet_has_the_measured_hardware_row() -> None:
    assert "h200-27b" in HARDWARE
    profile, pool_on, slow = hardware_row("h200-27b", STUDY_27B)
    assert profile == load_profile("h200-27b") and pool_on and slow is None
