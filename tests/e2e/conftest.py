"""Fixtures of the real-vLLM suite: the tiny model, two vLLM replicas with KV events.

Tests marked ``vllm`` run only when selected (``make test-vllm`` passes ``-m vllm``); a
run without ``-m`` deselects them, so plain ``pytest`` never reports them as passed or
skipped. Once selected they never skip: a missing vLLM venv or a replica that cannot start
FAILS the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_servers import REPO, VllmServer, make_model, vllm_python

try:
    from markers import deselect_unless_chosen
    from servers_redis import free_port
except ImportError:
    from tests.markers import deselect_unless_chosen
    from tests.servers_redis import free_port


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_unless_chosen(config, items, "vllm")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    python = vllm_python()
    if not python.exists():
        pytest.fail(f"no vLLM venv at {python}: run `make test-vllm` (it builds .venv-vllm)")
    return make_model(python, REPO / ".cache" / "e2e-model")


@pytest.fixture(scope="session")
def engines(tiny_model: Path) -> Iterator[list[VllmServer]]:
    """Two replicas, started together. Replica 0's publisher binds ``tcp://*:P`` (the usual
    deployment; the router connects); replica 1 is given ``tcp://127.0.0.1:P``, so vLLM
    connects and the router binds (``bind:``). Both bind their replay endpoint."""
    servers = []
    for cpu in (0, 1):
        port, pub, replay = free_port(), free_port(), free_port()
        events = f"tcp://*:{pub}" if cpu == 0 else f"tcp://127.0.0.1:{pub}"
        servers.append(VllmServer(vllm_python(), tiny_model, port, events,
                                  f"tcp://127.0.0.1:{replay}", cpu))
    try:
        for s in servers:
            s.launch()
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()
