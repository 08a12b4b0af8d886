"""Prefix residency index: the protocol and its memory, Redis and resilient forms.

``open_index`` builds the configured one: no URL (or ``memory``) gives a ``MemoryIndex``;
``redis://host:port/db`` gives a ``ResilientIndex`` over a ``RedisIndex`` with a local
``MemoryIndex`` fallback of the same capacity. The Redis client is imported only then
(or on first use of ``router.index.RedisIndex``): a memory-index router never loads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from policies.base import DEFAULT_BLOCK_TOKENS
from router.index.base import IndexCapacity, IndexUnavailable, PrefixIndex
from router.index.memory import MemoryIndex
from router.index.resilient import ResilientIndex

if TYPE_CHECKING:
    from router.index.redis import RedisIndex

__all__ = [
    "IndexCapacity",
    "IndexUnavailable",
    "MemoryIndex",
    "PrefixIndex",
    "RedisIndex",
    "ResilientIndex",
    "open_index",
]


def __getattr__(name: str) -> Any:
    if name == "RedisIndex":
        from router.index.redis import RedisIndex

        return RedisIndex
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_index(
    url: str | None,
    capacity: IndexCapacity | None = None,
    *,
    clock: Callable[[], float] = time.time,
    monotonic: Callable[[], float] = time.monotonic,
    on_error: Callable[[str], None] | None = None,
    lookup_timeout_s: float = 0.005,
    lookup_timeout_max_s: float = 0.05,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    namespace: str = "lmroute",
) -> PrefixIndex:
    """The index for ``url``; ``clock`` stamps entries, ``monotonic`` drives backoff."""
    local = MemoryIndex(capacity, clock=clock, block_tokens=block_tokens)
    if url is None or url == "memory":
        return local
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"unsupported index URL scheme: {url!r}")
    from router.index.redis import RedisIndex

    shared = RedisIndex(url, capacity, namespace=namespace, clock=clock, block_tokens=block_tokens)
    return ResilientIndex(
        shared, local, clock=monotonic, on_error=on_error, lookup_timeout_s=lookup_timeout_s,
        lookup_timeout_max_s=lookup_timeout_max_s,
    )
