"""Build emulated replicas of one deployment and serve them (and a router) in one event loop.

Pool spec (``--pool``): ``off`` (no shared pool: the study's OFF), ``local`` (a pool of its
own), ``redis://HOST:PORT/DB`` (a ``RedisPool``: the pool's residency in Redis, shared by
every replica process given the same URL, sim.emulator.redis_pool), or any other name:
the in-process pool of that name from a ``PoolRegistry``, so replicas built with the same
name share one ``SharedPool`` object (the demo's two replicas; separate processes with
the same name each get their own pool). A replica on a ``RedisPool`` runs its model clock
from the pool's epoch, so ready times compare across processes.

``LoopServers`` runs several ``uvicorn.Server`` instances as tasks of the running loop on
127.0.0.1 ports it picks, waits until each has started, and stops them all (graceful
shutdown, then cancellation) on exit.

``emulated_deployment`` is what the demo, ``lmroute live`` and ``lmroute ab --emulated``
run: N model replicas sharing one fresh pool (or none) and the router in front of them,
the router told the pool's size (0 without one) so its index never believes in a pool
that is not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import uvicorn

from sim.emulator.engine import DEFAULT_BLOCK_SIZE, ModelEngine
from sim.emulator.kv_events import KvEventPublisher
from sim.emulator.redis_pool import RedisPool
from sim.emulator.server import EmulatedReplica, Faults, create_replica_app
from sim.replica.model import ReplicaModel
from sim.replica.pool import Pool, SharedPool
from sim.replica.profiles import Profile


@dataclass
class PoolRegistry:
    """Named in-process pools; a registry object is passed explicitly (no module state)."""

    pools: dict[str, SharedPool] = field(default_factory=dict)

    def resolve(self, spec: str, profile: Profile, time_scale: float = 1.0) -> Pool | None:
        if spec == "off":
            return None
        if spec == "local":
            return profile.make_pool()
        if spec.startswith(("redis://", "rediss://", "unix://")):
            return RedisPool.connect(spec, profile, time_scale)
        if spec not in self.pools:
            self.pools[spec] = profile.make_pool()
        return self.pools[spec]


def model_replica(
    name: str,
    profile: Profile,
    pool: Pool | None,
    *,
    model: str,
    time_scale: float,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_events_endpoint: str | None = None,
    kv_events_topic: str = "kv-events",
    kv_events_pool_medium: str = "cpu",
    faults: Faults | None = None,
    fixed_created: int | None = None,
    start: float | None = None,
) -> EmulatedReplica:
    """An emulated replica whose timing is the replica model of ``profile``.

    ``start``: the ``time.monotonic()`` its model clock counts from (default: now).
    Replicas sharing an in-process pool need one ``start``: ready times in the pool are
    on the clock of the replica that stored them, and a second replica built ``g``
    seconds later would otherwise see every chunk ``g`` seconds late (a miss under load).
    A ``RedisPool`` brings its own epoch on the wall clock instead."""
    publisher = KvEventPublisher(kv_events_endpoint, kv_events_topic) if kv_events_endpoint else None
    engine = ModelEngine(ReplicaModel(name, profile, pool), model_name=model,
                         block_size=block_size, publisher=publisher,
                         pool_medium=kv_events_pool_medium)
    clock: dict[str, Any] = {"start": start}
    if isinstance(pool, RedisPool):  # one model clock for every replica of the pool
        clock = {"clock": time.time, "start": pool.epoch}
    return EmulatedReplica(model=model, engine=engine, time_scale=time_scale,
                           block_size=block_size, faults=faults, fixed_created=fixed_created,
                           **clock)


def close_replica(replica: EmulatedReplica) -> None:
    """Release what a replica holds beyond memory (its KV-event socket)."""
    engine = replica.engine
    if isinstance(engine, ModelEngine) and engine.publisher is not None:
        engine.publisher.close()
    if isinstance(engine, ModelEngine) and isinstance(engine.model.pool, RedisPool):
        engine.model.pool.close()


class LoopServers:
    """``async with LoopServers([app, ...]) as urls``: serve ASGI apps on loopback ports."""

    def __init__(self, apps: Sequence[Any]) -> None:
        self.apps = list(apps)
        self._servers: list[uvicorn.Server] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> list[str]:
        urls = []
        for app in self.apps:
            # Bind here and hand uvicorn the socket: picking a free port and binding it
            # later races with every other process doing the same (seen as uvicorn's
            # start-up exit 3 when tests ran in parallel with other servers).
            sock = socket.socket()
            # Accepted sockets inherit this: uvicorn sets it only on sockets it binds itself,
            # and without it Nagle + delayed ACK add ~40 ms to every small reply.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                    access_log=False, lifespan="auto")
            server = uvicorn.Server(config)
            # Several servers share one loop: none may take over SIGINT/SIGTERM (uvicorn
            # would restore the handlers out of order); Ctrl-C reaches the caller instead.
            server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
            self._servers.append(server)
            self._tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
            urls.append(f"http://127.0.0.1:{port}")
        while not all(s.started for s in self._servers):
            for task in self._tasks:
                if task.done():
                    await self.__aexit__(None, None, None)
                    raise RuntimeError("a server failed to start") from task.exception()
            await asyncio.sleep(0.01)
        return urls

    async def stop(self, index: int) -> None:
        """Stop one server (its port then refuses connections: a lost replica)."""
        self._servers[index].should_exit = True
        await asyncio.wait({self._tasks[index]}, timeout=5.0)

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        for server in self._servers:
            server.should_exit = True
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=5.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._servers.clear()
        self._tasks.clear()


@dataclass
class EmulatedDeployment:
    """A running ``emulated_deployment``: where to send requests, and its replicas."""

    router_url: str
    replica_urls: list[str]
    replica_servers: LoopServers

    async def stop_replica(self, index: int) -> None:
        """Take one replica away (its port refuses connections: a lost replica)."""
        await self.replica_servers.stop(index)


@contextlib.asynccontextmanager
async def emulated_deployment(profile: Profile, *, policy: str, pool_on: bool, model: str,
                              time_scale: float, replicas: int = 2,
                              **router_settings: Any) -> AsyncIterator[EmulatedDeployment]:
    """Fresh replicas, pool and router; ``router_settings`` override the router's
    ``Settings`` (the defaults probe health every second and scrape every 0.5 s, and
    replies name replicas by URL)."""
    from router.app import create_app  # the CLI layer's tools: the router is a peer here
    from router.settings import Settings

    pool = profile.make_pool() if pool_on else None
    start = time.monotonic()  # one model clock for replicas sharing the pool
    built = [model_replica(f"r{i}", profile, pool, model=model, time_scale=time_scale,
                           start=start) for i in range(replicas)]
    servers = LoopServers([create_replica_app(r) for r in built])
    # The experiments match x-lmroute-replica against replica URLs (live.py's lost replica).
    # No live canary: its replays would add load and cache state the experiments do not count.
    options: dict[str, Any] = {"health_interval_s": 1.0, "scrape_interval_s": 0.5,
                               "pool_bytes": profile.pool_bytes if pool_on else 0,
                               "expose_replica_header": True, "canary_rate": 0.0}
    options.update(router_settings)
    try:
        async with servers as urls:
            settings = Settings(backends=tuple(urls), policy=policy, **options)
            async with LoopServers([create_app(settings)]) as (router_url,):
                yield EmulatedDeployment(router_url, urls, servers)
    finally:
        for r in built:
            close_replica(r)
