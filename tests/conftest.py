"""Shared fixtures. Redis: a real redis-server on loopback (see servers_redis.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

try:  # tests/ is on sys.path while it has no __init__.py (pytest's rootdir insertion)
    from servers_redis import RedisServer
except ImportError:  # tests/ became a package
    from tests.servers_redis import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session; tests isolate by key namespace."""
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[[], RedisServer]]:
    """Start private redis-servers (for tests that stop and restart one)."""
    started: list[RedisServer] = []

    def start() -> RedisServer:
        server = RedisServer().start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


try:
    from servers import Server, replica, router
except ImportError:  # tests/ became a package
    from tests.servers import Server, replica, router


@pytest.fixture
def start_servers() -> Iterator[Callable[[Server], Server]]:
    """Start lmroute subprocesses for one test; all are stopped at teardown."""
    started: list[Server] = []

    def start(server: Server) -> Server:
        started.append(server)
        return server.start()

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture(scope="module")
def two_replicas() -> Iterator[list[Server]]:
    """Two emulated replicas with byte-reproducible replies, shared by a test module."""
    servers = [replica("--fixed-created", "1700000000", "--tpot", "0.001").start()
               for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


__all__ = ["Server", "replica", "router"]
