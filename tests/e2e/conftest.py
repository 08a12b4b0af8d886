"""Fixtures of the real-vLLM suite: the tiny model, one or two vLLM replicas with KV events.

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


def _server(model: Path, cpu: int) -> VllmServer:
    """Replica 0's publisher binds ``tcp://*:P`` (the usual deployment; the router
    connects); replica 1 is given ``tcp://127.0.0.1:P``, so vLLM connects and the router
    binds (``bind:``). Both bind their replay endpoint."""
    port, pub, replay = free_port(), free_port(), free_port()
    events = f"tcp://*:{pub}" if cpu == 0 else f"tcp://127.0.0.1:{pub}"
    return VllmServer(vllm_python(), model, port, events, f"tcp://127.0.0.1:{replay}", cpu)


@pytest.fixture(scope="session")
def engine(tiny_model: Path) -> Iterator[VllmServer]:
    """One replica: enough for the tests that only ask vLLM (token parity)."""
    server = _server(tiny_model, 0)
    try:
        yield server.launch().wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def engines(engine: VllmServer, tiny_model: Path) -> Iterator[list[VllmServer]]:
    """Two replicas: ``engine`` and a second one on the other core."""
    second = _server(tiny_model, 1)
    try:
        yield [engine, second.launch().wait_ready()]
    finally:
        second.stop()
