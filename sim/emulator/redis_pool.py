"""The shared pool's residency in Redis, so emulated replicas in separate processes share it.

``SharedPool`` (sim.replica.pool) lives in one process: the simulator and the one-process
demo share the object. Separate ``lmroute replica`` processes (or containers) given the
same ``--pool redis://HOST:PORT/DB`` share a ``RedisPool`` instead: the same chunk LRU,
with the same semantics (``BlockLRU``: tail-first touch so heads stay most recent, ready
times, eviction of the least recent when full), kept in Redis under ``lmroute:pool:*``:

- ``lmroute:pool:ready``  hash: chunk key -> ready time (model seconds, see the clock)
- ``lmroute:pool:lru``    sorted set: chunk key scored by a recency counter (``...:seq``)
- ``lmroute:pool:stats``  hash: stores, stored_chunks, loads, loaded_chunks, evictions,
  corrupt_loads (never reset by ``clear``)
- ``lmroute:pool:tainted`` set: chunk keys written wrong (the emulator's ``replica``
  corrupt-pool mode, sim.emulator.corruption); emptied by ``clear``
- ``lmroute:pool:meta``   hash: capacity_chunks, chunk_tokens, bytes_per_token,
  time_scale, epoch, written by the first replica (HSETNX); a later replica whose
  profile or time scale disagrees refuses to start, naming the field.

A store is one Lua script (atomic, so two replicas never evict past the capacity); a
lookup is one HMGET. As in LMCache, a lookup and the store that follows it are separate
steps, so two replicas prefilling the same prompt at once both store it (the second
store adds nothing).

The clock. Ready times compare across replicas only on one clock: replicas on a Redis
pool run their model clock from the pool's ``epoch`` (wall-clock seconds, set by the
first replica) at the pool's ``time_scale``: ``model_now = (time.time() - epoch) /
time_scale``. Hosts (or containers on one host) must share wall time, as NTP gives.

Keys are 64-bit chunk hashes: Lua treats them as strings (its numbers are doubles).
The Redis client is the synchronous one: the replica model is synchronous, and a loopback
round trip (~0.1 ms) is small next to the emulated prefill it precedes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import redis

from sim.replica.gpu_cache import NO_CHANGE, BlockKey, CacheChange
from sim.replica.profiles import Profile

PREFIX = "lmroute:pool:"
STATS = ("stores", "stored_chunks", "loads", "loaded_chunks", "evictions", "corrupt_loads")

# KEYS: lru, ready, stats, seq. ARGV: capacity, ready_at, chunk keys tail first.
_STORE = """
local cap = tonumber(ARGV[1])
local ready = ARGV[2]
local stored, evicted = {}, {}
for i = 3, #ARGV do
  local key = ARGV[i]
  local old = redis.call('HGET', KEYS[2], key)
  if not old then
    while redis.call('ZCARD', KEYS[1]) >= cap do
      local gone = redis.call('ZPOPMIN', KEYS[1])
      redis.call('HDEL', KEYS[2], gone[1])
      evicted[#evicted + 1] = gone[1]
    end
    redis.call('HSET', KEYS[2], key, ready)
    stored[#stored + 1] = key
  elseif tonumber(ready) < tonumber(old) then
    redis.call('HSET', KEYS[2], key, ready)
  end
  redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[4]), key)
end
if #stored > 0 then
  redis.call('HINCRBY', KEYS[3], 'stores', 1)
  redis.call('HINCRBY', KEYS[3], 'stored_chunks', #stored)
end
if #evicted > 0 then
  redis.call('HINCRBY', KEYS[3], 'evictions', #evicted)
end
return {stored, evicted}
"""


class RedisPool:
    """``SharedPool``'s interface over Redis (see the module docstring)."""

    def __init__(self, client: redis.Redis, profile: Profile, time_scale: float,
                 *, enabled: bool = True, corrupt: bool = False) -> None:
        self.chunk_tokens = profile.chunk_tokens
        self.bytes_per_token = profile.bytes_per_token
        self.chunk_bytes = self.chunk_tokens * self.bytes_per_token
        if profile.pool_bytes < self.chunk_bytes:
            raise ValueError(f"capacity {profile.pool_bytes} B holds no {self.chunk_bytes} B chunk")
        self.capacity_chunks = profile.pool_bytes // self.chunk_bytes
        self.enabled = enabled
        self.corrupt = corrupt
        self._r = client
        self._store = client.register_script(_STORE)
        self._keys = [PREFIX + k for k in ("lru", "ready", "stats", "seq")]
        self.time_scale, self.epoch = self._agree(time_scale)

    @classmethod
    def connect(cls, url: str, profile: Profile, time_scale: float) -> RedisPool:
        """A pool at ``url`` (redis://HOST:PORT/DB); raises ``ValueError`` when unreachable."""
        client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        try:
            return cls(client, profile, time_scale)
        except redis.RedisError as exc:
            raise ValueError(f"pool {url}: {exc}") from None

    def _agree(self, time_scale: float) -> tuple[float, float]:
        """Write this pool's shape if first, else check ours against it; (scale, epoch)."""
        mine: dict[str, Any] = {"capacity_chunks": self.capacity_chunks,
                                "chunk_tokens": self.chunk_tokens,
                                "bytes_per_token": self.bytes_per_token,
                                "time_scale": repr(float(time_scale)), "epoch": repr(time.time())}
        meta = PREFIX + "meta"
        pipe = self._r.pipeline()
        for name, value in mine.items():
            pipe.hsetnx(meta, name, value)
        pipe.hgetall(meta)
        held = {k.decode(): v.decode() for k, v in pipe.execute()[-1].items()}
        for name in ("capacity_chunks", "chunk_tokens", "bytes_per_token", "time_scale"):
            if held[name] != str(mine[name]):
                raise ValueError(f"the shared pool has {name}={held[name]}, this replica "
                                 f"{mine[name]}: every replica of one pool needs the same "
                                 f"profile and --time-scale")
        return float(held["time_scale"]), float(held["epoch"])

    def model_now(self) -> float:
        """The pool's model clock (see the module docstring)."""
        return (time.time() - self.epoch) / self.time_scale

    def _ready_times(self, chain: Sequence[BlockKey]) -> list[bytes | str | None]:
        if not chain:
            return []
        held: list[bytes | str | None] = self._r.hmget(PREFIX + "ready", [str(k) for k in chain])
        return held

    def contains_prefix(self, chain: Sequence[BlockKey], at: float = math.inf) -> int:
        """Leading chunks of ``chain`` held and ready by ``at``; 0 while the pool is off."""
        if not self.enabled:
            return 0
        n = 0
        for ready in self._ready_times(chain):
            if ready is None or float(ready) > at:
                break
            n += 1
        return n

    def count_missing(self, chain: Sequence[BlockKey]) -> int:
        """Chunks a ``store(chain)`` would write now (0 while off)."""
        if not self.enabled:
            return 0
        return sum(1 for r in self._ready_times(chain[: self.capacity_chunks]) if r is None)

    def store(self, chain: Sequence[BlockKey], ready_at: float = 0.0) -> CacheChange:
        """Write the chain's chunks through (missing ones added, all made recent)."""
        if not self.enabled or not chain:
            return NO_CHANGE
        tail_first = [str(k) for k in reversed(chain[: self.capacity_chunks])]
        stored, evicted = self._store(keys=self._keys,
                                      args=[self.capacity_chunks, repr(float(ready_at)), *tail_first])
        # Reported in chain order (stored) and eviction order, as BlockLRU does.
        return CacheChange(tuple(int(k) for k in reversed(stored)), tuple(int(k) for k in evicted))

    def record_load(self, chunks: int) -> bool:
        """Count a replica's load of ``chunks`` chunks; returns whether it was corrupt."""
        if chunks <= 0:
            return False
        pipe = self._r.pipeline()
        pipe.hincrby(PREFIX + "stats", "loads", 1)
        pipe.hincrby(PREFIX + "stats", "loaded_chunks", chunks)
        if self.corrupt:
            pipe.hincrby(PREFIX + "stats", "corrupt_loads", 1)
        pipe.execute()
        return self.corrupt

    def taint(self, keys: Sequence[BlockKey]) -> None:
        """Mark chunks as written wrong (sim.emulator.corruption's ``replica`` mode)."""
        if keys:
            self._r.sadd(PREFIX + "tainted", *(str(k) for k in keys))

    def tainted(self, keys: Sequence[BlockKey]) -> bool:
        """Whether any of ``keys`` was written wrong."""
        if not keys:
            return False
        held: list[int] = self._r.smismember(PREFIX + "tainted", [str(k) for k in keys])  # type: ignore[assignment]
        return any(held)

    @property
    def used_chunks(self) -> int:
        return int(self._r.zcard(PREFIX + "lru"))

    def stats(self) -> dict[str, int]:
        """The pool's counters, summed over every replica that uses it."""
        held = self._r.hgetall(PREFIX + "stats")
        return {name: int(held.get(name.encode(), 0)) for name in STATS}

    def clear(self) -> tuple[BlockKey, ...]:
        """Empty the pool (a restart); returns the keys that were held."""
        held: list[bytes] = self._r.zrange(PREFIX + "lru", 0, -1)  # type: ignore[assignment]
        keys = tuple(int(k) for k in held)
        self._r.delete(PREFIX + "lru", PREFIX + "ready", PREFIX + "tainted")
        return keys

    def close(self) -> None:
        self._r.close()
