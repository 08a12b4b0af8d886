"""``lmroute validate`` against real processes: two emulated replicas sharing one Redis
pool (``lmroute replica --pool redis://...``) and a real ``lmroute serve`` in front.

A healthy pair passes; every corrupt-pool mode of the emulator (sim.emulator.corruption)
fails, the report naming the tier and the first differing position. Modes are switched
on the running replicas through ``POST /_emulator/faults``; each run's fresh salts keep
runs apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.validate.compare import Reply, compare

try:
    from servers import pooled_deployment, router
except ImportError:  # tests/ became a package
    from tests.servers import pooled_deployment, router

KEY = "validate-admin"
FAST = ["--lengths", "2048,8192", "--prompts", "2"]


@pytest.fixture(scope="module")
def deployment() -> Iterator[dict[str, Any]]:
    with pooled_deployment("--admin-key", KEY) as (rt, reps):
        yield {"router": rt.url, "replicas": [r.url for r in reps]}


def _faults(urls: list[str], **faults: Any) -> None:
    for url in urls:
        httpx.post(url + "/_emulator/faults", json=faults).raise_for_status()


def _validate(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "router.cli", "validate", *args,
                           "--json", str(out)], capture_output=True, text=True, timeout=120,
                          check=False)
    return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr


def test_a_healthy_pair_passes_at_default_settings(deployment: dict[str, Any],
                                                   tmp_path: Path) -> None:
    _faults(deployment["replicas"])
    t0 = time.monotonic()
    rc, report, out = _validate(tmp_path, "--target", deployment["router"], "--admin-key", KEY,
                                "--plot", str(tmp_path / "report.png"))
    assert time.monotonic() - t0 < 60, "the issue's bound for a default run"
    assert rc == 0, out
    tiers = report["tiers"]
    assert {t: tiers[t]["verdict"] for t in tiers} == dict.fromkeys(tiers, "pass")
    for tier in ("warm", "pool", "evicted"):  # every cache tier really hit a cache
        assert tiers[tier]["cache_hits"] > 0
    assert (tmp_path / "report.png").stat().st_size > 0


@pytest.mark.parametrize(("mode", "extra", "faulty"), [
    ("all", {}, slice(None)),
    ("load", {"corrupt_load": 2}, slice(None)),
    ("position", {"corrupt_position": 4096}, slice(None)),
    ("replica", {}, slice(1, None)),  # what r1 writes is wrong for every reader, r0 too
])
def test_every_corrupt_mode_fails_naming_tier_and_position(
        deployment: dict[str, Any], tmp_path: Path, mode: str, extra: dict[str, int],
        faulty: slice) -> None:
    _faults(deployment["replicas"][faulty], corrupt_pool=mode, **extra)
    # ``load`` corrupts only a load made while another request is in prefill on the same
    # replica: with FAST's two prompts per replica a busy machine can stagger them apart,
    # so that mode sends six per replica (twelve per tier, eight at a time).
    sizes = ["--prompts", "6"] if mode == "load" else []
    try:
        rc, report, out = _validate(tmp_path, "--target", deployment["router"],
                                    "--admin-key", KEY, *FAST, *sizes)
    finally:
        _faults(deployment["replicas"])
    assert rc == 1, out
    tiers = report["tiers"]
    assert tiers["pool"]["verdict"] == "FAIL"
    assert tiers["warm"]["verdict"] == "pass" and tiers["cold-other"]["verdict"] == "pass"
    assert tiers["pool"]["first_diff"] == 0  # the emulator's logprobs move from position 0
    assert "FAIL pool" in out and "first differing output position 0" in out
    if mode == "position":  # the 2,048-token prompts load too little to reach position 4,096
        assert tiers["pool"]["failing_lengths"] == [8192]
    if mode == "replica":  # prompts alternate home replicas: those r1 wrote fail
        assert 0 < tiers["pool"]["matched"] < tiers["pool"]["prompts"]


def test_direct_backends_mode_passes_without_a_router(deployment: dict[str, Any],
                                                      tmp_path: Path) -> None:
    _faults(deployment["replicas"])
    args = [a for url in deployment["replicas"] for a in ("--backend", url)]
    rc, report, out = _validate(tmp_path, *args, *FAST, "--no-evict")
    assert rc == 0, out
    assert report["tiers"]["evicted"]["skipped"] == "--no-evict"


def _pinned(url: str, pin: str, key: str | None) -> httpx.Response:
    headers = {"X-LMRoute-Pin-Replica": pin}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(url + "/v1/completions", headers=headers, json={
        "prompt": "pin me", "max_tokens": 2})


def test_the_pin_header_is_the_admins_only(deployment: dict[str, Any]) -> None:
    url = deployment["router"]
    for name in ("r0", "r1", "r0", "r1"):
        resp = _pinned(url, name, KEY)
        assert resp.status_code == 200 and resp.headers["x-lmroute-replica"] == name
    by_url = _pinned(url, deployment["replicas"][1], KEY)
    assert by_url.headers["x-lmroute-replica"] == "r1"
    for key in (None, "wrong"):
        refused = _pinned(url, "r0", key)
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "pin_forbidden"
    unknown = _pinned(url, "r9", KEY)
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_replica"


def test_without_an_admin_key_pinning_is_off(deployment: dict[str, Any]) -> None:
    rt = router(deployment["replicas"]).start()
    try:
        resp = _pinned(rt.url, "r0", "anything")
        assert resp.status_code == 403 and "has none" in resp.json()["error"]["message"]
    finally:
        rt.stop()


def _reply(tokens: str, logprobs: list[float], margins: list[float]) -> Reply:
    return Reply(list(tokens), logprobs, list(margins), None, 10)


def test_compare_tells_a_near_tie_from_a_flip_and_noise_from_a_shift() -> None:
    ref = _reply("abcd", [-1.0, -1.0, -1.0, -1.0], [1.0, 0.01, 1.0, 1.0])
    assert compare(ref, _reply("abcd", [-1.001, -1.0, -0.999, -1.0], [1] * 4), 0.05).ok
    tie = compare(ref, _reply("aXYZ", [-1.0, -1.0, -1.0, -1.0], [1] * 4), 0.05)
    assert tie.ok and tie.near_tie == 1  # a flip where the reference was a near tie
    flip = compare(ref, _reply("abXd", [-1.0] * 4, [1] * 4), 0.05)
    assert not flip.ok and flip.first_token_diff == 2  # a clear margin (1.0) there
    shifted = compare(ref, _reply("abcd", [-1.0, -1.3, -1.3, -1.3], [1] * 4), 0.05)
    assert not shifted.ok and shifted.first_logprob_diff == 1 and shifted.first_token_diff is None
    short = compare(ref, _reply("ab", [-1.0, -1.0], [1, 1]), 0.05)
    assert short.first_token_diff == 2
