"""The shared prefix index in Redis, so that several routers see each other's records.

Layout under a namespace ``ns`` (default ``lmroute``; the braces are a cluster hash tag, so
all keys of one namespace share a slot); block keys are 8-byte big-endian strings:

- ``{ns}:blocks`` hash: block key -> holder bitmap, a little-endian bit string whose bit
  ``s`` (byte ``s // 8``, bit ``s % 8``) says tier slot ``s`` holds the block. Slot 0 is
  the pool, replicas get 1, 2, ... A block held nowhere has no field (never all zeros).
  One pin field ``''`` keeps the hash a real hash table (see ``_PIN``);
- ``{ns}:slots`` hash: replica id -> its slot (the lowest free one, taken by its first
  record, released by ``forget``);
- ``{ns}:lru:pool``, ``{ns}:lru:gpu:<replica>`` sorted sets: each tier's blocks scored by
  last-seen time (the LRU order, and the last-seen time the index keeps per block).

Why: one HMGET tells, per block, which tiers hold it, so a lookup reads each chain block
once whatever the number of replicas (the previous layout ran one SMISMEMBER per tier
against a member set kept beside each sorted set), and tiers holding the same block share
its hash entry. ZMSCORE is no alternative: it formats every score as a 17-digit string.

Each operation is one Lua script run with EVALSHA (redis-py loads it on NOSCRIPT): ONE
round trip, atomic against other routers. The chain travels as one binary argument.
``lookup`` reads the slots, then walks the chain in growing batches (64, 256, then 1024
blocks per HMGET): a tier's leading run ends at the first bitmap without its bit, and the
walk stops once every run has ended (a cold chain costs one small batch). It never writes.
``record`` adds the chain to the tier's sorted set with head-newest scores, sets the
tier's bit where missing, then evicts the lowest scores beyond the capacity and clears
their bits; ``evict`` removes given keys the same way. ``forget`` clears the replica's
bit on each block of its sorted set, deletes the set and frees the slot: O(blocks held),
in batches of 512. Lua numbers reach Redis with 17 significant digits, so the 1 µs steps
between scores survive.

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
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from policies.base import DEFAULT_BLOCK_TOKENS, ReplicaId, Residency, Tier
from router.index.base import (
    DEFAULT_STEP_S,
    BlockKey,
    IndexCapacity,
    IndexUnavailable,
    check_record,
)

# KEYS: blocks hash, slots hash. ARGV: chain blob.
# Returns {pool_count, replica, count, replica, count, ...} (replicas with count > 0).
_LOOKUP = """
local blob, sub, byte, band = ARGV[1], string.sub, string.byte, bit.band
local n = #blob / 8
local names, byte_of, bit_of, runs = {false}, {1}, {1}, {}
local slots = redis.call('HGETALL', KEYS[2])
for i = 1, #slots, 2 do
  local s = tonumber(slots[i + 1])
  names[#names + 1] = slots[i]
  byte_of[#byte_of + 1] = math.floor(s / 8) + 1
  bit_of[#bit_of + 1] = 2 ^ (s % 8)
end
local tiers, active = #names, #names
-- Bitmaps take few distinct values and Lua interns strings: passes[v] caches "every
-- running tier's bit is set in v", which stays true as runs end.
local passes = {}
local done, size = 0, 64
while done < n and active > 0 do
  local last = math.min(done + size, n)
  local fields = {}
  for i = done + 1, last do fields[i - done] = sub(blob, 8 * i - 7, 8 * i) end
  local bitmaps = redis.call('HMGET', KEYS[1], unpack(fields))
  for j = 1, last - done do
    local v = bitmaps[j]
    if not (v and passes[v]) then
      for t = 1, tiers do
        if not runs[t] and band(v and byte(v, byte_of[t]) or 0, bit_of[t]) == 0 then
          runs[t] = done + j - 1
          active = active - 1
        end
      end
      if active == 0 then break end
      passes[v] = true
    end
  end
  done = last
  if size < 1024 then size = size * 4 end
end
local out = {runs[1] or n}
for t = 2, tiers do
  local count = runs[t] or n
  if count > 0 then
    out[#out + 1] = names[t]
    out[#out + 1] = count
  end
end
return out
"""

# Shared by _RECORD and _DROP; KEYS[1] is the blocks hash. flip() returns bitmap v with
# bit (k, m) set or cleared, trailing zero bytes dropped ('' when empty), or false when
# unchanged; memo caches it per distinct (interned) v. clear() applies it to members,
# deleting the fields that become empty.
_BITMAPS = """
local function flip(memo, v, k, m, set)
  v = v or ''
  local out = memo[v]
  if out ~= nil then return out end
  out = v
  if #out < k then out = out .. string.rep('\\0', k - #out) end
  local b = string.byte(out, k)
  local nb = set and bit.bor(b, m) or bit.band(b, bit.bnot(m))
  if nb == b then
    out = false
  else
    out = string.sub(out, 1, k - 1) .. string.char(nb) .. string.sub(out, k + 1)
    out = (string.gsub(out, '%z+$', ''))
  end
  memo[v] = out
  return out
end
local function clear(members, k, m)
  local bitmaps = redis.call('HMGET', KEYS[1], unpack(members))
  local dead, changed, memo = {}, {}, {}
  for j = 1, #members do
    local v = bitmaps[j] and flip(memo, bitmaps[j], k, m, false)
    if v == '' then
      dead[#dead + 1] = members[j]
    elseif v then
      changed[#changed + 1] = members[j]
      changed[#changed + 1] = v
    end
  end
  if #dead > 0 then redis.call('HDEL', KEYS[1], unpack(dead)) end
  if #changed > 0 then redis.call('HSET', KEYS[1], unpack(changed)) end
end
"""

# KEYS: blocks hash, tier's sorted set, slots hash. ARGV: chain blob, now, step, capacity,
# pin (see _PIN), [replica] (none for the pool). unpack() is limited by Lua's C stack
# (~8000 values): batches of 512.
_RECORD = (
    _BITMAPS
    + """
local blob = ARGV[1]
local now, step, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local slot = 0
if ARGV[6] then
  slot = tonumber(redis.call('HGET', KEYS[3], ARGV[6]) or -1)
  if slot < 0 then
    local used = {}
    for _, s in ipairs(redis.call('HVALS', KEYS[3])) do used[tonumber(s)] = true end
    slot = 1
    while used[slot] do slot = slot + 1 end
    redis.call('HSET', KEYS[3], ARGV[6], slot)
  end
end
redis.call('HSETNX', KEYS[1], '', ARGV[5])
local k, m = math.floor(slot / 8) + 1, 2 ^ (slot % 8)
local n, i, memo = #blob / 8, 1, {}
while i <= n do
  local last = math.min(i + 511, n)
  local scored, members = {}, {}
  for j = i, last do
    local member = string.sub(blob, 8 * j - 7, 8 * j)
    scored[#scored + 1] = now - (j - 1) * step
    scored[#scored + 1] = member
    members[#members + 1] = member
  end
  -- A tier's sorted set and its bits change together: when ZADD adds no member (a
  -- refresh), every bit is already set.
  if redis.call('ZADD', KEYS[2], unpack(scored)) > 0 then
    local bitmaps = redis.call('HMGET', KEYS[1], unpack(members))
    local changed = {}
    for j = 1, #members do
      local v = flip(memo, bitmaps[j], k, m, true)
      if v then
        changed[#changed + 1] = members[j]
        changed[#changed + 1] = v
      end
    end
    if #changed > 0 then redis.call('HSET', KEYS[1], unpack(changed)) end
  end
  i = last + 1
end
local excess = redis.call('ZCARD', KEYS[2]) - cap
while excess > 0 do
  local batch = math.min(excess, 512)
  local old = redis.call('ZRANGE', KEYS[2], 0, batch - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, batch - 1)
  clear(old, k, m)
  excess = excess - batch
end
return 0
"""
)

# KEYS: blocks hash, tier's sorted set, slots hash. ARGV: keys blob ('': every key, then
# free the slot: forget), [replica] (none for the pool).
_DROP = (
    _BITMAPS
    + """
local blob, slot = ARGV[1], 0
if ARGV[2] then
  slot = redis.call('HGET', KEYS[3], ARGV[2])
  if not slot then return 0 end
  slot = tonumber(slot)
end
local k, m = math.floor(slot / 8) + 1, 2 ^ (slot % 8)
if blob == '' then
  while true do
    local old = redis.call('ZRANGE', KEYS[2], 0, 511)
    if #old == 0 then break end
    redis.call('ZREMRANGEBYRANK', KEYS[2], 0, 511)
    clear(old, k, m)
  end
  redis.call('HDEL', KEYS[3], ARGV[2])
  return 0
end
local n, i = #blob / 8, 1
while i <= n do
  local members = {}
  for j = i, math.min(i + 511, n) do members[#members + 1] = string.sub(blob, 8 * j - 7, 8 * j) end
  -- Keys the tier does not hold have no bit to clear.
  if redis.call('ZREM', KEYS[2], unpack(members)) > 0 then clear(members, k, m) end
  i = i + 512
end
return 0
"""
)


# Value of the blocks hash's pin field '' (no block key is empty). Longer than
# hash-max-ziplist-value (hash-max-listpack-value in Redis 7, default 64), it keeps the hash
# a real hash table: Redis packs hashes of up to 512 short fields into one ziplist, where
# HMGET scans linearly per field (1.8 ms of server time per 512-block lookup, not 0.2 ms).
_PIN = "lmroute prefix index: block key -> holder bitmap (bit 0 pool, 1.. replicas)".ljust(96)


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
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
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
        self._drop = self._client.register_script(_DROP)
        tag = "{" + namespace + "}"
        self._blocks_key = f"{tag}:blocks"
        self._slots_key = f"{tag}:slots"
        self._pool_lru = f"{tag}:lru:pool"
        self._gpu_lru = f"{tag}:lru:gpu:"

    async def _run(self, what: str, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise IndexUnavailable(f"redis {what} failed: {exc!r}") from exc

    def _lru(self, replica: ReplicaId | None) -> str:
        return self._pool_lru if replica is None else self._gpu_lru + replica

    async def lookup(self, chain: Sequence[BlockKey]) -> Residency:
        if not chain:
            return Residency(chain_blocks=0, block_tokens=self._block_tokens)
        keys = [self._blocks_key, self._slots_key]
        reply = await self._run("lookup", self._lookup, keys, [pack_chain(chain)])
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
        cap = self.capacity.pool_blocks if replica is None else self.capacity.gpu_for(replica)
        # Blocks beyond the capacity would be evicted at once (they are the oldest).
        args = [pack_chain(chain[:cap]), repr(self._clock()), repr(self._step_s), str(cap), _PIN]
        args += [] if replica is None else [replica]
        keys = [self._blocks_key, self._lru(replica), self._slots_key]
        await self._run("record", self._record, keys, args)

    async def evict(
        self, keys: Sequence[BlockKey], tier: Tier, replica: ReplicaId | None = None
    ) -> None:
        check_record(tier, replica)
        if keys:
            args = [pack_chain(keys), *([] if replica is None else [replica])]
            names = [self._blocks_key, self._lru(replica), self._slots_key]
            await self._run("evict", self._drop, names, args)

    async def forget(self, replica: ReplicaId) -> None:
        keys = [self._blocks_key, self._gpu_lru + replica, self._slots_key]
        await self._run("forget", self._drop, keys, ["", replica])

    async def close(self) -> None:
        await self._client.aclose()

    async def warm(self) -> None:
        """Connect and load the scripts now, so the first routed lookup pays neither
        (a cold first lookup took 2.5-5 ms: over the 5 ms budget on a busy machine)."""
        try:
            await self._client.ping()
            for script in (self._lookup, self._record, self._drop):
                await self._client.script_load(script.script)
        except (RedisError, OSError) as exc:
            raise IndexUnavailable(f"redis warm-up failed: {exc!r}") from exc
