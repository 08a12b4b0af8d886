"""Routes with no prompt prefix (``/tokenize`` here) are balanced by ``locality`` and teach
it nothing: vLLM's own benchmark client sent 484 ``/tokenize`` calls through the router
in one run, and before this their replies (a few milliseconds) were learnt as prefills of
their prompts, and their one-off sessions parked as between turns."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson

try:
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica, router


def test_tokenize_is_balanced_and_teaches_locality_nothing(
        start_servers: Callable[[Server], Server]) -> None:
    reps = [start_servers(replica("--profile", "study-27b", "--time-scale", "0.01"))
            for _ in range(2)]
    rt = start_servers(router([r.url for r in reps], "--policy", "locality"))
    prompt = " ".join(f"w{i}" for i in range(1200))
    for _ in range(12):
        resp = httpx.post(rt.url + "/tokenize", timeout=30,
                          content=orjson.dumps({"model": "emulated-27b", "prompt": prompt}),
                          headers={"content-type": "application/json"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["count"] > 1000
    state = httpx.get(rt.url + "/policy").json()
    assert state["calibration"]["observations"] == 0
    assert sum(state["returning"]["parked"].values()) == 0
    assert all(n == 0 for n in state["queued"].values())
    assert state["new_prefixes"]["warm_share"] == 1.0
    metrics = httpx.get(rt.url + "/metrics").text
    balanced = [line for line in metrics.splitlines()
                if line.startswith("lmroute_decisions_total") and 'reason="balanced"' in line]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in balanced) == 12
