"""``lmroute serve --workers N``: N router processes serving one listening socket.

The parent binds the socket once and forks N workers before any event loop, client
session or thread exists; each worker builds its own app (``serve_one``) and serves the
inherited socket, and the kernel gives each new connection to whichever worker accepts
it first. One shared socket rather than one ``SO_REUSEPORT`` socket per worker:
connections waiting in the accept queue belong to the socket, not to a worker, so a
worker that stops (drained, crashed, killed) strands none of them; the others accept them.

The parent supervises: a worker that exits while the parent is not stopping is replaced
by a fresh fork (after ``RESTART_DELAY_S``, so a worker that cannot start does not spin).
SIGTERM or SIGINT to the parent goes to every worker, each drains as ``router.drain``
says (not ready, a grace, in-flight requests finish), and the parent exits once all have.

What workers share. Each worker has its own policy state, replica health and metrics
(``/metrics`` is one worker's view: scrape per process, or sum). The prefix index is
shared only through ``--index redis://...``: every worker records what it served and
reads what the others recorded, so each one's policy sees what a router among several
sees. With the embedded index a worker learns only from its own 1/N of the traffic;
with ``--kv-events`` every worker subscribes to the engines' events, so each embedded
index is complete and exact (the sound set-up without Redis). Otherwise a warning is
logged at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import FrameType

from router.settings import Settings

log = logging.getLogger("lmroute.workers")
RESTART_DELAY_S = 0.5
BIND_FAILED = 3  # uvicorn's exit status when it cannot bind (tests/servers.py re-picks)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket all workers share (uvicorn's options: reuse address, 2048)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def sharing_warning(settings: Settings) -> str | None:
    """Why N workers route from partial knowledge, or None when they share it."""
    if settings.workers <= 1 or settings.index.startswith(("redis://", "rediss://", "unix://")):
        return None
    if settings.kv_events:
        return None
    return (f"--workers {settings.workers} with the embedded index: each worker learns only "
            "from the requests it serves; use --index redis://... (shared) or --kv-events")


class Supervisor:
    """Forks the workers and replaces any that exits until told to stop."""

    def __init__(self, n: int, work: Callable[[], int]):
        self.n = n
        self.work = work
        self.children: dict[int, int] = {}  # pid -> slot
        self.stopping = False

    def _fork(self, slot: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker: default signal handling, then serve until told to stop
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 1
            try:
                code = self.work()
            finally:
                os._exit(code)
        self.children[pid] = slot
        log.warning("worker %d started (pid %d)", slot, pid)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        self.stopping = True
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for slot in range(self.n):
            self._fork(slot)
        worst = 0
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:  # pragma: no cover (PEP 475 retries os.wait)
                continue
            if pid not in self.children:
                continue
            slot = self.children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            worst = max(worst, abs(code))
            if not self.stopping:
                log.warning("worker %d (pid %d) exited with %d: restarting", slot, pid, code)
                time.sleep(RESTART_DELAY_S)
                if not self.stopping:
                    self._fork(slot)
        return 0 if self.stopping else worst


def serve_workers(settings: Settings, serve_one: Callable[[socket.socket], int]) -> int:
    """Bind, fork ``settings.workers`` workers each running ``serve_one(sock)``, supervise."""
    warning = sharing_warning(settings)
    if warning:
        log.warning("%s", warning)
    try:
        sock = bind(settings.host, settings.port)
    except OSError as exc:
        log.error("cannot bind %s:%d: %s", settings.host, settings.port, exc)
        return BIND_FAILED
    sys.stdout.flush()
    return Supervisor(settings.workers, lambda: serve_one(sock)).run()
