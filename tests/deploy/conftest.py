"""Fixtures of the container suite (``make test-deploy``).

Tests marked ``deploy`` run only when selected (``-m deploy``); a run without ``-m``
deselects them, and ``make test`` passes ``-m "not vllm and not deploy"``. Once selected
they never skip: no docker, no image or a stack that does not come up FAILS the run.
``make test-deploy`` (deploy/test-setup.sh) installs Docker, starts dockerd, builds the
local base images and the router image first.

``stack``: the emulated compose stack (stack.py) on free ports, brought down (containers
removed) at teardown, also after a failure. ``report``: measured numbers, written to
LMROUTE_DEPLOY_REPORT at the end of the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from markers import deselect_unless_chosen
    from servers_redis import free_port
    from stack import COMPOSE_FILE, IMAGE, REDIS_IMAGE, Stack, wait_ok
except ImportError:  # tests/ became a package
    from tests.deploy.stack import COMPOSE_FILE, IMAGE, REDIS_IMAGE, Stack, wait_ok
    from tests.markers import deselect_unless_chosen
    from tests.servers_redis import free_port


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselect_unless_chosen(config, items, "deploy")
    deselect_unless_chosen(config, items, "vllm")  # test_vllm_flags.py: make test-vllm


@pytest.fixture(scope="session")
def report() -> Iterator[dict[str, Any]]:
    numbers: dict[str, Any] = {}
    yield numbers
    out = os.environ.get("LMROUTE_DEPLOY_REPORT")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(numbers, indent=2) + "\n")


@pytest.fixture(scope="module")
def stack(report: dict[str, Any]) -> Iterator[Stack]:
    ports = {"ROUTER_PORT": free_port(), "REPLICA_A_PORT": free_port(),
             "REPLICA_B_PORT": free_port(), "REDIS_PORT": free_port()}
    env = {**os.environ, "LMROUTE_IMAGE": IMAGE, "REDIS_IMAGE": REDIS_IMAGE,
           **{k: str(v) for k, v in ports.items()}}
    running = Stack(f"lmroute-test-{os.getpid()}", env,
                    f"http://127.0.0.1:{ports['ROUTER_PORT']}",
                    {"a": ports["REPLICA_A_PORT"], "b": ports["REPLICA_B_PORT"]})
    try:
        started = time.monotonic()
        running.compose("up", "-d")
        wait_ok(running.router_url + "/ready", 60.0)
        for port in running.replica_ports.values():
            wait_ok(f"http://127.0.0.1:{port}/health", 60.0)
        report["stack_up_s"] = round(time.monotonic() - started, 2)
        yield running
    finally:
        subprocess.run(["docker-compose", "-p", running.project, "-f", str(COMPOSE_FILE),
                        "down", "-t", "2"], env=env, capture_output=True, timeout=120,
                       check=False)
