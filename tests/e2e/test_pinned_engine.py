"""A real vLLM engine started with ``pin`` runs its whole process tree on its one core.

``bench/vllm_policies.py --pin-engines`` relies on it: with only the compute threads bound,
the two engines' API servers and engine-core loops ran on each other's core, and one
engine alone answered 3x faster than two (docs/locality.md, "Each engine pinned whole to
its core"). If vLLM (or a later version of it) widened a child's affinity again, the
benchmark would silently measure that contention again; this test would fail instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from vllm_servers import MODEL_NAME, VllmServer, vllm_python

try:
    from servers_redis import free_port
except ImportError:
    from tests.servers_redis import free_port

pytestmark = pytest.mark.vllm
CPU = 1


def _tree(pgid: int) -> dict[int, list[int]]:
    """Process id -> its threads' ids, for every process in process group ``pgid``
    (the server's: it starts its own session, and its children stay in it)."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == pgid:
                out[int(entry.name)] = [int(t.name) for t in (entry / "task").iterdir()]
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return out


def _affinity(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except ProcessLookupError:  # a thread that ended since the listing
        return None


def test_pinned_engine_keeps_every_process_and_thread_on_its_core(tiny_model: Path) -> None:
    server = VllmServer(vllm_python(), tiny_model, free_port(), f"tcp://*:{free_port()}",
                        f"tcp://127.0.0.1:{free_port()}", CPU, pin=True)
    try:
        server.launch().wait_ready()
        resp = httpx.post(server.url + "/v1/completions", timeout=120,
                          json={"model": MODEL_NAME, "prompt": "warm up", "max_tokens": 2})
        assert resp.status_code == 200, resp.text
        assert server.proc is not None
        tree = _tree(server.proc.pid)
        # the API server, the engine core and its worker at least
        assert len(tree) >= 3, tree
        allowed = {(pid, tid): _affinity(tid) for pid, tids in tree.items() for tid in tids}
        wide = {k: v for k, v in allowed.items() if v is not None and v != {CPU}}
        assert not wide, f"threads allowed beyond core {CPU}: {wide}"
    finally:
        server.stop()
