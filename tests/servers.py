"""Real servers for tests: emulated replicas and routers as subprocesses on 127.0.0.1.

Each is started through the ``lmroute`` CLI exactly as a user would, waited for on its
readiness URL, and killed by pid at teardown (SIGKILL on request, to test failover).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

try:
    from servers_redis import RedisServer, free_port
except ImportError:  # tests/ became a package
    from tests.servers_redis import RedisServer, free_port

LOG_DIR = Path(os.environ.get("LMROUTE_TEST_LOGS", "/tmp/lmroute-test-logs"))
UVICORN_STARTUP_FAILURE = 3  # uvicorn's exit status when it cannot bind


class PortTaken(Exception):
    """The server exited at start-up: another process took its port first."""


class Server:
    """One ``lmroute`` subprocess listening on ``port``."""

    def __init__(self, args: list[str], port: int, ready_path: str = "/health",
                 env: dict[str, str] | None = None, name: str = "server",
                 repick_port: bool = False, module: str = "router.cli"):
        self.args = args
        self.module = module  # run as ``python -m MODULE ARGS``
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self.env = env
        self.name = name
        self.repick_port = repick_port
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_start: int | None = None

    @property
    def log_path(self) -> Path:
        return LOG_DIR / f"{self.name}-{self.port}.log"

    def log_lines(self) -> list[str]:
        """What this server wrote. The file is appended to, and an earlier test's server may
        have had the same port, so only the bytes after this server's first start count."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_start or 0)
            return f.read().decode(errors="replace").splitlines()

    def start(self, timeout_s: float = 30.0) -> Server:
        """Start and wait until ready; a port taken between picking and binding (another
        process won the race) is re-picked, a few times, when the port was ours to pick."""
        for _ in range(3 if self.repick_port else 1):
            try:
                return self._start(timeout_s)
            except PortTaken:
                new = free_port()
                self.args = [str(new) if a == str(self.port) else a for a in self.args]
                self.port, self.url = new, f"http://127.0.0.1:{new}"
                self._log_start = None  # a new port, a new log file
        return self._start(timeout_s)

    def _start(self, timeout_s: float) -> Server:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        if self._log_start is None:
            self._log_start = log.tell()
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, *self.args],
                                     stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self.proc.returncode == UVICORN_STARTUP_FAILURE:
                    raise PortTaken(self.port)
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"see {LOG_DIR}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"{self.name} on port {self.port} not ready in {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL: the replica vanishes mid-whatever, like a crashed host."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


def sse_data(stream: bytes) -> list[bytes]:
    """The ``data:`` payloads of a whole SSE reply, up to its closing ``[DONE]``."""
    events = [e.removeprefix(b"data: ") for e in stream.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    return events[:-1]


def replica(*extra: str, port: int | None = None) -> Server:
    chosen = port or free_port()
    return Server(["replica", "--port", str(chosen), *extra], chosen, name="replica",
                  repick_port=port is None)


def router(backends: list[str], *extra: str, port: int | None = None) -> Server:
    chosen = port or free_port()
    # No drain grace: test teardown (SIGTERM) stops the router at once.
    args = ["serve", "--port", str(chosen), "--drain-grace-s", "0"]
    for b in backends:
        args += ["--backend", b]
    return Server([*args, *extra], chosen, name="router", repick_port=port is None)


@contextlib.contextmanager
def pooled_deployment(*router_args: str, time_scale: str = "0.01"
                      ) -> Iterator[tuple[Server, list[Server]]]:
    """A private redis-server, two emulated replicas (``study-27b`` at ``time_scale``,
    named r0 and r1) in separate processes sharing its pool, and a router in front
    (``router_args`` added); everything stopped on exit."""
    pool = RedisServer().start()
    started: list[Server] = []
    try:
        for i in range(2):
            started.append(replica("--profile", "study-27b", "--time-scale", time_scale,
                                   "--pool", pool.url, "--name", f"r{i}").start())
        reps = list(started)
        started.append(router([r.url for r in reps], *router_args).start())
        yield started[-1], reps
    finally:
        for server in reversed(started):
            server.stop()
        pool.close()
