"""bench/request_calls.py counts the router's Python calls per request from two cProfile runs
of a real ``lmroute serve``: it must keep working as the request path changes, and count
the request path (not start-up, which the two runs cancel out)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_call_count_is_per_request_and_names_the_request_path(tmp_path: Path) -> None:
    out = tmp_path / "calls.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "request_calls.py"), "--policies",
                    "round_robin", "--n", "60", "--warm", "20", "--top", "60", "--json",
                    str(out)], check=True, timeout=240, capture_output=True)
    result = json.loads(out.read_text())["results"]["round_robin"]
    # Start-up runs tens of thousands of calls; a request a few hundred.
    assert 100 < result["calls_per_request"] < 5000
    callers = [name for name, _ in result["top"]]
    assert any(name.startswith("router/proxy.py") for name in callers)
    assert any(name.startswith("router/wire_pool.py") for name in callers)
