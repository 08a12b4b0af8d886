"""The emulated compose stack for the container suite, and how to wait on it.

``Stack``: deploy/compose.emulated.yml run under its own compose project, on free loopback
ports, with the images named by LMROUTE_IMAGE and REDIS_IMAGE (defaults: the ones
deploy/test-setup.sh builds).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
COMPOSE_FILE = ROOT / "deploy" / "compose.emulated.yml"
IMAGE = os.environ.get("LMROUTE_IMAGE", "lmroute:test")
REDIS_IMAGE = os.environ.get("REDIS_IMAGE", "lmroute-redis:bookworm")


@dataclass
class Stack:
    """A running emulated stack: its project, ports and environment."""

    project: str
    env: dict[str, str]
    router_url: str
    replica_ports: dict[str, int] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 180.0) -> str:
        done = subprocess.run(["docker-compose", "-p", self.project, "-f", str(COMPOSE_FILE),
                               *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"docker-compose {args}: {done.stderr[-2000:]}"
        return done.stdout

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip()


def wait_ok(url: str, timeout_s: float) -> float:
    """Seconds until ``url`` answers 200; fails after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    pytest.fail(f"{url} not 200 within {timeout_s} s")
