"""Which replica holds a stored response: ``/v1/responses`` ids -> replica URL.

vLLM keeps a response (and the conversation a ``previous_response_id`` continues) in the
memory of the replica that created it, so ``GET``/``DELETE /v1/responses/{id}``,
``POST .../cancel`` and a follow-up turn must reach that replica. The router learns each
id from the reply (``router.passthrough``) and keeps it here: in memory (the newest
``max_entries``), and in Redis when ``--index`` is a Redis URL, so routers sharing one
index share the map (``SET lmroute:response:ID URL EX ttl_s``). Redis errors are logged
and the in-memory map answers; an id found nowhere is looked for on every replica by the
caller.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

log = logging.getLogger("lmroute.responses")
KEY = "lmroute:response:"


class ResponseIds:
    """id -> replica URL, in memory and optionally in Redis."""

    def __init__(self, redis_url: str | None, *, ttl_s: float, max_entries: int = 100_000):
        self._local: OrderedDict[str, str] = OrderedDict()
        self._max = max_entries
        self._ttl = max(1, int(ttl_s))
        self._redis: Any = None
        self._errors: tuple[type[BaseException], ...] = (OSError,)
        if redis_url:  # imported only then: a router without Redis never loads it
            import redis.asyncio as aioredis
            from redis.exceptions import RedisError

            self._redis = aioredis.from_url(redis_url, socket_timeout=1.0)
            self._errors = (RedisError, OSError)

    async def put(self, response_id: str, replica: str) -> None:
        self._local[response_id] = replica
        self._local.move_to_end(response_id)
        while len(self._local) > self._max:
            self._local.popitem(last=False)
        if self._redis is not None:
            try:
                await self._redis.set(KEY + response_id, replica, ex=self._ttl)
            except self._errors as exc:
                log.warning("response id not written to Redis: %r", exc)

    async def get(self, response_id: str) -> str | None:
        if self._redis is not None:
            try:
                found = await self._redis.get(KEY + response_id)
                if found is not None:
                    return found.decode() if isinstance(found, bytes) else str(found)
            except self._errors as exc:
                log.warning("response id not read from Redis: %r", exc)
        return self._local.get(response_id)

    async def delete(self, response_id: str) -> None:
        self._local.pop(response_id, None)
        if self._redis is not None:
            try:
                await self._redis.delete(KEY + response_id)
            except self._errors as exc:
                log.warning("response id not deleted from Redis: %r", exc)

    async def forget_replica(self, replica: str) -> None:
        """A removed replica's responses are gone with it (memory map only; Redis
        entries expire)."""
        for rid in [k for k, v in self._local.items() if v == replica]:
            del self._local[rid]

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
