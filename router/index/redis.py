"""The shared prefix index in Redis, so that several routers see each other's records.

Layout, under a namespace ``ns`` (default ``lmroute``; the braces are a cluster hash tag
so every key of one namespace lands in one slot), members being 8-byte big-endian keys:

- ``{ns}:gpu:<replica>`` set: the blocks believed on that replica's GPU (lookups read it);
- ``{ns}:gpu:<replica>:lru`` sorted set: the same blocks, scored by last-seen time (the
  LRU order, and the last-seen time the index keeps per block);
- ``{ns}:pool`` and ``{ns}:pool:lru``: the same pair for the shared pool;
- ``{ns}:replicas`` set of replica ids that have GPU entries.

Membership lives in a plain set beside the sorted set because lookups must be cheap:
SMISMEMBER answers integers, while ZMSCORE formats every score as a 17-digit string
(measured with Redis 6.2: 5 x 512 members 0.28 ms vs 1.3 ms server time). The price is
~50 more bytes per block (see docs/benchmarks.md).

Both operations are one server-side Lua script each, run with EVALSHA (redis-py loads the
script on NOSCRIPT), so a lookup is ONE round trip whatever the chain length. The chain
travels as one binary argument (8 bytes per block), which keeps the RESP request small.
``lookup`` counts leading members present with SMISMEMBER (Redis >= 6.2) in growing
batches (32, 128, 512, then 1024 at a time) and stops at the first miss, so a cold
replica costs one small batch; it never writes. ``record`` adds the chain to both
structures with head-newest scores, then evicts the lowest scores beyond the capacity
from both. Lua numbers reach Redis with 17 significant digits, so the 1 µs steps between
scores survive.

Semantics equal ``MemoryIndex`` (one parametrized test suite) as long as the routers'
clocks agree to within the gaps between their records; ties order by member bytes.
Every Redis or socket error is mapped to ``IndexUnavailable`` here, at one boundary.
Parameters: ``url`` (``redis://host:port/db``), ``capacity``, ``namespace``, ``clock``,
``block_tokens``, ``step_s``, ``socket_timeout_s``. One immediate client retry (stale
connections); falling back and backing off is ``ResilientIndex``'s job.
"""

from __future__ import annotations

import sys
import time
from array import array
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from policies.base import ReplicaId, Residency, Tier
from router.index.base import (
    DEFAULT_STEP_S,
    BlockKey,
    IndexCapacity,
    IndexUnavailable,
    check_record,
)

# KEYS: replicas set, pool member set. ARGV: chain blob, GPU member-set key prefix.
# Returns {pool_count, replica, count, replica, count, ...} (replicas with count > 0).
_LOOKUP = """
local blob = ARGV[1]
local n = #blob / 8
local members = {}
for i = 1, n do members[i] = string.sub(blob, 8 * i - 7, 8 * i) end
local function leading(key)
  local done, size = 0, 32
  while done < n do
    local last = math.min(done + size, n)
    local present = redis.call('SMISMEMBER', key, unpack(members, done + 1, last))
    for j = 1, last - done do
      if present[j] == 0 then return done + j - 1 end
    end
    done = last
    if size < 1024 then size = size * 4 end
  end
  return n
end
local out = {leading(KEYS[2])}
for _, replica in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local count = leading(ARGV[2] .. replica)
  if count > 0 then
    out[#out + 1] = replica
    out[#out + 1] = count
  end
end
return out
"""

# KEYS: member set, recency zset, [replicas set]. ARGV: chain blob, now, step, capacity,
# [replica]. unpack() is limited by Lua's C stack (~8000 values): batches of 512.
_RECORD = """
local blob = ARGV[1]
local now, step, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = #blob / 8
local i = 1
while i <= n do
  local last = math.min(i + 511, n)
  local scored, plain = {}, {}
  for j = i, last do
    local member = string.sub(blob, 8 * j - 7, 8 * j)
    scored[#scored + 1] = now - (j - 1) * step
    scored[#scored + 1] = member
    plain[#plain + 1] = member
  end
  redis.call('ZADD', KEYS[2], unpack(scored))
  redis.call('SADD', KEYS[1], unpack(plain))
  i = last + 1
end
local excess = redis.call('ZCARD', KEYS[2]) - cap
while excess > 0 do
  local batch = math.min(excess, 512)
  local old = redis.call('ZRANGE', KEYS[2], 0, batch - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, batch - 1)
  redis.call('SREM', KEYS[1], unpack(old))
  excess = excess - batch
end
if KEYS[3] then redis.call('SADD', KEYS[3], ARGV[5]) end
return 0
"""


def pack_chain(chain: Sequence[BlockKey]) -> bytes:
    """The chain as 8-byte big-endian members, concatenated (one Lua argument)."""
    packed = array("Q", chain)
    if sys.byteorder == "little":
        packed.byteswap()
    return packed.tobytes()


class RedisIndex:
    """``PrefixIndex`` in a Redis shared by several routers (redis.asyncio client)."""

    def __init__(
        self,
        url: str,
        capacity: IndexCapacity | None = None,
        *,
        namespace: str = "lmroute",
        clock: Callable[[], float] = time.time,
        block_tokens: int = 256,
        step_s: float = DEFAULT_STEP_S,
        socket_timeout_s: float = 1.0,
    ) -> None:
        self.capacity = capacity or IndexCapacity()
        self._clock = clock
        self._block_tokens = block_tokens
        self._step_s = step_s
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            # One immediate retry: a pooled connection goes stale when Redis restarts and
            # fails its next command once; every operation here is idempotent.
            retry=Retry(NoBackoff(), 1),
        )
        self._lookup = self._client.register_script(_LOOKUP)
        self._record = self._client.register_script(_RECORD)
        tag = "{" + namespace + "}"
        self._replicas_key = f"{tag}:replicas"
        self._pool_keys = [f"{tag}:pool", f"{tag}:pool:lru"]
        self._gpu_prefix = f"{tag}:gpu:"

    async def lookup(self, chain: Sequence[BlockKey]) -> Residency:
        if not chain:
            return Residency(chain_blocks=0, block_tokens=self._block_tokens)
        try:
            reply = await self._lookup(
                keys=[self._replicas_key, self._pool_keys[0]],
                args=[pack_chain(chain), self._gpu_prefix],
            )
        except (RedisError, OSError) as exc:
            raise IndexUnavailable(f"redis lookup failed: {exc!r}") from exc
        gpu = {reply[i].decode(): int(reply[i + 1]) for i in range(1, len(reply) - 1, 2)}
        return Residency(
            chain_blocks=len(chain),
            block_tokens=self._block_tokens,
            gpu=gpu,
            pool=int(reply[0]),
        )

    async def record(
        self, chain: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        check_record(tier, replica)
        if not chain:
            return
        if replica is None:
            keys = self._pool_keys
            cap = self.capacity.pool_blocks
            extra: list[str] = []
        else:
            member_key = self._gpu_prefix + replica
            keys = [member_key, member_key + ":lru", self._replicas_key]
            cap = self.capacity.gpu_for(replica)
            extra = [replica]
        # Blocks beyond the capacity would be evicted at once (they are the oldest).
        blob = pack_chain(chain[:cap])
        args: list[bytes | str] = [blob, repr(self._clock()), repr(self._step_s), str(cap)]
        args += extra
        try:
            await self._record(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise IndexUnavailable(f"redis record failed: {exc!r}") from exc

    async def forget(self, replica: ReplicaId) -> None:
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(self._gpu_prefix + replica, self._gpu_prefix + replica + ":lru")
                pipe.srem(self._replicas_key, replica)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise IndexUnavailable(f"redis forget failed: {exc!r}") from exc

    async def close(self) -> None:
        await self._client.aclose()

    async def ping(self) -> None:
        """One PING, e.g. to fail fast at start-up; raises ``IndexUnavailable``."""
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            raise IndexUnavailable(f"redis ping failed: {exc!r}") from exc
