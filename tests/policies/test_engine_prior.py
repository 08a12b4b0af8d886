"""``bench/engine_prior.py``: a ``locality`` prior fitted to an engine's prefill times.

The committed prior (``docs/engine-prior-cpu-epyc.toml``) must be what the script makes of
the committed measurements (``docs/engine-prefill-alone.json``) byte for byte, and it must
load as a prior that predicts those measurements.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from policies.cost import load_prior

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "engine_prior.py"
MEASURED = ROOT / "docs" / "engine-prefill-alone.json"
SHIPPED = ROOT / "docs" / "engine-prior-cpu-epyc.toml"


def _fit(result: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), str(result), "--out", str(out)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_the_script_rebuilds_the_committed_prior(tmp_path: Path) -> None:
    out = tmp_path / "engine-prior-cpu-epyc.toml"
    done = _fit(MEASURED.relative_to(ROOT), out)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == SHIPPED.read_text()


def test_the_prior_predicts_the_engine_it_was_fitted_to() -> None:
    prior = load_prior(SHIPPED)
    assert prior.name == "engine-prior-cpu-epyc"
    assert prior.load_fixed_s == load_prior().load_fixed_s  # not measured: from the base
    by_length: dict[int, list[float]] = {}
    for b in json.loads(MEASURED.read_text())["bursts"]:
        by_length.setdefault(round(b["tokens"], -2), []).append(b["ttft_ms"][0] / 1000)
    for length, times in by_length.items():
        mean = sum(times) / len(times)
        if length >= 1800:  # long prompts: within 10 % (short ones scatter by 70 %)
            assert abs(prior.prefill_s(0, length) / mean - 1) < 0.10, (length, mean)


def test_a_known_quadratic_is_recovered(tmp_path: Path) -> None:
    """Times made from known coefficients come back as those coefficients."""
    fixed, token, token2 = 0.02, 4e-5, 2e-8
    bursts = [{"kind": "alone", "k": 1, "rep": 0, "tokens": n,
               "ttft_ms": [1000 * (fixed + token * n + token2 * n * n)]}
              for n in (300, 1200, 2500, 6000)]
    result = tmp_path / "alone.json"
    result.write_text(json.dumps({"cpu": None, "bursts": bursts}))
    out = tmp_path / "p.toml"
    done = _fit(result, out)
    assert done.returncode == 0, done.stderr
    prior = load_prior(out)
    assert abs(prior.prefill_fixed_s / fixed - 1) < 1e-3
    assert abs(prior.prefill_token_s / token - 1) < 1e-3
    assert abs(prior.prefill_token2_s / token2 - 1) < 1e-3
