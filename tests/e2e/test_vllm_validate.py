"""``lmroute validate`` on the real-vLLM CPU pair: cold vs warm (GPU prefix hit) and cold
on the other replica, over 20 prompts, must pass; the measured divergence of a healthy
engine goes to $LMROUTE_E2E_REPORT under ``validate`` (docs/validate.md records it).

The e2e pair has no LMCache, so there is no pool: the ``pool`` and ``evicted`` tiers run
(B computes the prompt itself, and A after a reset) and must match, and since the suite
runs vLLM with ``--enable-prompt-tokens-details`` each reply says what was cached:
validate calls those two tiers ``not exercised`` (no prompt hit a cache) and exits 3,
inconclusive, never 1. The warm tier must report a cache hit on every prompt, and the
engines' own ``vllm:prefix_cache_hits`` must rise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from vllm_servers import VllmServer

pytestmark = pytest.mark.vllm


def _prefix_hits(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def _validate(engines: list[VllmServer], out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    args = [a for e in engines for a in ("--backend", e.url)]
    done = subprocess.run([sys.executable, "-m", "router.cli", "validate", *args,
                           "--lengths", "256,2048", "--prompts", "10", "--json", str(out),
                           *extra], capture_output=True, text=True, timeout=900, check=False)
    print(done.stdout, done.stderr)
    return done.returncode, json.loads(out.read_text())


def _measured(report: dict[str, Any]) -> dict[str, Any]:
    return {t: {k: v[k] for k in ("verdict", "prompts", "matched", "max_dlogprob",
                                  "first_diff")}
            for t, v in report["tiers"].items()}


def test_validate_passes_on_a_healthy_vllm_pair(engines: list[VllmServer],
                                                tmp_path: Path) -> None:
    hits = [_prefix_hits(e.url) for e in engines]
    rc, batched = _validate(engines, tmp_path / "batched.json")
    gained = [_prefix_hits(e.url) - h for e, h in zip(engines, hits, strict=True)]
    rc1, serial = _validate(engines, tmp_path / "serial.json", "--concurrency", "1")
    entry = {"concurrency_8": _measured(batched), "concurrency_1": _measured(serial),
             "prefix_cache_hits_gained": gained, "prompt_seeds": [batched["prompt_seed"],
                                                                  serial["prompt_seed"]]}
    print("\nvalidate:", json.dumps(entry))
    if path := os.environ.get("LMROUTE_E2E_REPORT"):
        target = Path(path)
        data = json.loads(target.read_text()) if target.exists() else {}
        target.write_text(json.dumps({**data, "validate": entry}, indent=2))
    assert batched["tiers"]["warm"]["prompts"] == 20
    assert min(gained) > 0, "the warm tier hit each engine's prefix cache"
    for report in (batched, serial):
        verdicts = {t: v["verdict"] for t, v in report["tiers"].items()}
        assert verdicts == {"cold": "pass", "warm": "pass", "cold-other": "pass",
                            "pool": "not exercised", "evicted": "not exercised"}, \
            "a false alarm on a healthy engine"
        assert report["tiers"]["warm"]["cache_hits"] == 20
    assert (rc, rc1) == (3, 3), "no pool here: inconclusive, not failed"
