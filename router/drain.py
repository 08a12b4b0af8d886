"""Graceful drain on SIGTERM: not ready at once, still serving for a grace, then stop.

A load balancer needs time to notice a router going away; a router that stops listening
the moment it gets SIGTERM turns that time into refused connections. So on the first
SIGTERM (or SIGINT):

1. ``Drain.since`` is set: ``GET /ready`` answers 503 from then on (``router.routes``);
2. for ``drain_grace_s`` (default 5) everything else goes on as before, new requests
   included (the load balancer is still taking the router out of rotation);
3. then uvicorn's own graceful shutdown: the listener closes, idle keep-alive connections
   are closed, and requests in flight, streams included, finish, for up to
   ``drain_timeout_s`` (default 30; uvicorn's ``timeout_graceful_shutdown``), after which
   they are cancelled; then the lifespan's shutdown runs and the process exits.

A second signal during the grace skips the rest of it (step 3 at once); a SIGINT after
that forces the exit, as uvicorn does.
"""

from __future__ import annotations

import logging
import time
from types import FrameType

import uvicorn

log = logging.getLogger("lmroute.drain")


class Drain:
    """Whether the router is draining (set once, by the server's signal handler)."""

    def __init__(self) -> None:
        self.since: float | None = None

    @property
    def draining(self) -> bool:
        return self.since is not None


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a grace between the signal and closing the listener."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.grace_s = grace_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.since is None:
            self.drain.since = time.monotonic()
            log.warning("signal %d: draining (not ready; serving %.1f s more, then in-flight "
                        "requests finish)", sig, self.grace_s)
            if self.grace_s > 0:
                return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        since = self.drain.since
        if since is not None and not self.should_exit \
                and time.monotonic() - since >= self.grace_s:
            log.warning("drain grace over: closing the listener")
            self.should_exit = True
        return await super().on_tick(counter)
