"""Engine truth: vLLM KV-cache events (ZMQ) into the prefix index, one subscriber per replica.

Wire (vLLM's ``ZmqEventPublisher``, ``vllm/distributed/kv_events.py``): multipart
``[topic, seq (8-byte big-endian), msgpack payload]``; decoding and the engine-hash ->
our-key mapping live in ``router.kv_blocks``. The SUB socket connects to the publisher
(vLLM binds ``tcp://*:PORT``), or binds when the endpoint is written ``bind:tcp://...``
(vLLM given a concrete address connects to it).

Data-parallel engines publish per rank (router.event_sources: several endpoints per
replica); every rank is a publisher of its own. Per publisher sequence tracking, ``last``
being the last applied sequence number:
- ``seq == last + 1``: apply.
- ``seq <= last``: the engine restarted (its numbering restarts at 0, its cache is empty):
  forget what that rank held, then apply.
- ``seq > last + 1``: batches were lost (PUB drops at its high-water mark, or a reconnect).
  With a replay endpoint the missing ones are asked for (a DEALER to vLLM's ROUTER: send
  ``[b"", start_seq]``, read ``[b"", topic, seq, payload]`` until seq -1; versions that
  answer without the topic frame, ``[b"", seq, payload]``, are read too) and applied in
  order; when there is none, or it cannot fill the gap (its buffer moved on, 2 s
  timeout), the replica's entries are stale — a lost ``BlockRemoved`` would leave a false
  hit — so that rank's are forgotten and rebuilt from the events that follow (counted in
  ``gaps``). The first batch after subscribing may start anywhere; with a replay
  endpoint the publisher's buffer is replayed from 0 so a restarted router catches up.

Applying (``KvIngest``): attention groups only (``kv_cache_spec_kind`` "full_attention"
or unset; the first such ``group_idx`` seen per replica, so hybrid models' other groups and
duplicate attention groups are skipped). ``placement`` decides the tier: medium GPU is
the replica's GPU cache; an event's ``locality`` ("local"/"replica"/"instance"/"node"
vs anything else), when present, decides the rest; else a medium in ``local_media``
(default "CPU": vLLM's OffloadingConnector, the engine's own host memory) is replica-local
and any other (LMCache's "cpu", storage) the shared pool, tracked in one tracker shared
by all replicas (its hashes are content addressed). A replica-local block counts as that
replica's cached prefix (index tier GPU; no load cost is modelled) and never as the
pool's, so other replicas do not see it. vLLM's offload stores name GPU blocks without
their tokens (by default): they are keyed from the replica's GPU scope
(``ChainTracker.adopt``). Each replica has one tracker per (DP rank, local) scope; a
removal evicts only keys no other scope of the replica holds whole.
``AllBlocksCleared`` (``/reset_prefix_cache``; vLLM publishes it with its next engine
step), a restart or an unfilled gap drop that rank's scopes (the whole replica when
nothing else of it is tracked). Keys are rooted in ``root_key(model, salt, lora_name)``
with ``model`` = ``served_model`` or the replica's first ``/v1/models`` id.

Mode, per replica: "precise" once a batch has arrived from any of its publishers (the engine's
events then decide its GPU residency, and the router stops recording it on completion),
"approximate" before that or without a configured publisher (the router's own
bookkeeping). ``status()`` feeds ``/replicas``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import zmq
import zmq.asyncio

from policies.base import ReplicaId, Tier
from router.event_sources import EventConfig, EventSource, SourceState, parse_sources
from router.index import IndexUnavailable, PrefixIndex
from router.kv_blocks import ChainTracker, Cleared, Removed, Stored, decode_payload, root_salt
from router.prefix import BlockKey, root_key
from router.tasks import cancel_all

__all__ = ["EngineEvents", "EventConfig", "EventSource", "KvIngest", "parse_sources",
           "placement"]
log = logging.getLogger("lmroute.events")
LOCAL_MEDIA = ("CPU",)  # vLLM's OffloadingConnector to CPU: the engine's own memory
_LOCAL = frozenset({"local", "replica", "instance", "node"})
END_SEQ = -1
ModelOf = Callable[[ReplicaId], Awaitable[str | None]]


def replay_frames(frames: Sequence[bytes]) -> tuple[int, bytes] | None:
    """One replay reply as the DEALER reads it -> (seq, payload); None if malformed.

    Current vLLM answers ``[b"", topic, seq, payload]``; older versions (before the topic
    was added to replies) ``[b"", seq, payload]``. Both end with seq -1.
    """
    if len(frames) == 4 and len(frames[2]) == 8:
        return int.from_bytes(frames[2], "big", signed=True), frames[3]
    if len(frames) == 3 and len(frames[1]) == 8:
        return int.from_bytes(frames[1], "big", signed=True), frames[2]
    return None


def placement(event: Stored | Removed, local_media: Sequence[str] = LOCAL_MEDIA) -> str:
    """"gpu", "local" (the replica's own CPU offload) or "pool" (shared) for one event."""
    if event.medium.upper() == "GPU":
        return "gpu"
    if event.locality is not None:
        return "local" if event.locality.lower() in _LOCAL else "pool"
    return "local" if event.medium in local_media else "pool"


class KvIngest:
    """Applies decoded event batches to the index (no sockets: tests drive it directly).

    Per replica one tracker per (rank, local) scope; a replica holds one of our keys while
    any of its scopes holds it whole, so a removal in one scope evicts only keys no other
    scope of that replica still holds.
    """

    def __init__(self, index: PrefixIndex, model_of: ModelOf, *, block_tokens: int,
                 max_blocks: int, on_error: Callable[[str], None] = lambda kind: None,
                 local_media: Sequence[str] = LOCAL_MEDIA) -> None:
        self.index = index
        self._on_error = on_error  # an index write failed: reported as kind "events"
        self._model_of = model_of
        self._block_tokens = block_tokens
        self._max_blocks = max_blocks
        self._local_media = tuple(local_media)
        self._scopes: dict[ReplicaId, dict[tuple[int, bool], ChainTracker]] = {}
        self.pool = ChainTracker(block_tokens, max_blocks)

    def tracker(self, replica: ReplicaId, rank: int = 0, local: bool = False) -> ChainTracker:
        scopes = self._scopes.setdefault(replica, {})
        found = scopes.get((rank, local))
        if found is None:
            found = scopes[(rank, local)] = ChainTracker(self._block_tokens, self._max_blocks)
        return found

    def tracked(self, replica: ReplicaId) -> tuple[int, int]:
        """(engine blocks tracked, unresolved) over the replica's scopes."""
        scopes = self._scopes.get(replica, {}).values()
        return sum(len(t) for t in scopes), sum(t.unresolved for t in scopes)

    def _unheld(self, replica: ReplicaId, keys: Sequence[BlockKey]) -> list[BlockKey]:
        scopes = list(self._scopes.get(replica, {}).values())
        return [k for k in keys if not any(t.holds(k) for t in scopes)]

    def drop(self, replica: ReplicaId) -> None:
        """Forget a replica's trackers (it left the set; the index forgets it too)."""
        for tracker in self._scopes.pop(replica, {}).values():
            tracker.clear()

    async def forget(self, replica: ReplicaId, rank: int | None = None) -> None:
        """Drop one rank's scopes (restart, gap, cleared), or the whole replica."""
        scopes = self._scopes.get(replica, {})
        gone = [s for s in scopes if rank is None or s[0] == rank]
        keys = [k for s in gone for k in scopes[s].held_keys()]
        for scope in gone:
            scopes[scope].clear()
        try:
            if not any(len(t) for t in scopes.values()):
                await self.index.forget(replica)
            elif keys:
                await self.index.evict(self._unheld(replica, keys), Tier.GPU, replica)
        except IndexUnavailable:
            self._on_error("events")

    async def apply(self, state: SourceState, payload: bytes) -> None:
        replica, rank = state.source.replica, state.source.rank
        _, events = decode_payload(payload)
        model: str | None = None
        for event in events:
            if isinstance(event, Cleared):
                state.cleared += 1
                await self.forget(replica, rank)
                continue
            where = placement(event, self._local_media)
            pool = where == "pool"
            tier, who = (Tier.POOL, None) if pool else (Tier.GPU, replica)
            tracker = self.pool if pool else self.tracker(replica, rank, where == "local")
            if isinstance(event, Stored):
                if event.kind not in (None, "full_attention"):
                    continue
                if state.group_idx is None:
                    state.group_idx = event.group_idx
                if event.group_idx not in (None, state.group_idx):
                    continue
                if where == "local" and await self._adopted(state, event):
                    continue
                salt, keyable = root_salt(event)
                if not keyable:
                    tracker.unresolved += len(event.hashes)
                    continue
                model = model or await self._model_of(replica)
                if model is None:
                    tracker.unresolved += len(event.hashes)
                    continue
                state.blocks_stored += len(event.hashes)
                keys = tracker.store(event, root_key(model, salt, event.lora_name))
                await self._write(self.index.record(keys, tier, who) if keys else None)
            elif isinstance(event, Removed):
                if event.group_idx is not None and state.group_idx not in (None, event.group_idx):
                    continue
                state.blocks_removed += len(event.hashes)
                keys = tracker.remove(event.hashes)
                keys = keys if pool else self._unheld(replica, keys)
                await self._write(self.index.evict(keys, tier, who) if keys else None)

    async def _adopted(self, state: SourceState, event: Stored) -> bool:
        """A CPU-offload store of blocks the replica's GPU scope has keyed (vLLM's offload
        events carry no token ids by default): held in its local scope from those keys."""
        replica, rank = state.source.replica, state.source.rank
        keys = self.tracker(replica, rank, True).adopt(self.tracker(replica, rank), event)
        if keys is None:
            return False
        state.blocks_stored += len(event.hashes)
        await self._write(self.index.record(keys, Tier.GPU, replica) if keys else None)
        return True

    async def _write(self, call: Awaitable[None] | None) -> None:
        if call is None:
            return
        try:
            await call
        except IndexUnavailable:
            self._on_error("events")


class Subscriber:
    """One replica's SUB socket and sequence tracking; ``run()`` until cancelled."""

    def __init__(self, ctx: zmq.asyncio.Context, state: SourceState, ingest: KvIngest,
                 topic: str, replay_timeout_s: float = 2.0) -> None:
        self.state = state
        self._ctx = ctx
        self._ingest = ingest
        self._replay_timeout_s = replay_timeout_s
        self._clock = time.monotonic
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        source = state.source
        (self.sock.bind if source.bind else self.sock.connect)(source.endpoint)

    async def run(self) -> None:
        try:
            while True:
                frames = await self.sock.recv_multipart()
                await self.on_message(frames)
        finally:
            self.sock.close(0)

    async def on_message(self, frames: Sequence[bytes]) -> None:
        st = self.state
        if len(frames) != 3 or len(frames[1]) != 8:
            st.malformed += 1
            return
        seq = int.from_bytes(frames[1], "big")
        if st.last_seq is not None and seq <= st.last_seq:
            st.restarts += 1
            await self._ingest.forget(st.source.replica, st.source.rank)
        elif (st.last_seq is None and seq > 0 and st.source.replay) or (
            st.last_seq is not None and seq > st.last_seq + 1
        ):
            start = 0 if st.last_seq is None else st.last_seq + 1
            if not await self._replay(start, seq) and st.last_seq is not None:
                st.gaps += 1
                await self._ingest.forget(st.source.replica, st.source.rank)
        await self._apply(seq, frames[2])

    async def _apply(self, seq: int, payload: bytes) -> None:
        st = self.state
        try:
            await self._ingest.apply(st, payload)
        except ValueError as exc:
            st.malformed += 1
            log.warning("replica %s: %s", st.source.replica, exc)
        st.last_seq = seq
        st.batches += 1
        st.last_batch_at = self._clock()

    async def _replay(self, start: int, stop: int) -> bool:
        """Apply batches [start, stop) from the replay endpoint; True if none was missing."""
        endpoint = self.state.source.replay
        if endpoint is None:
            return False
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        expected = start
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            async with asyncio.timeout(self._replay_timeout_s):
                while True:
                    reply = replay_frames(await sock.recv_multipart())
                    if reply is None:
                        return False
                    seq, payload = reply
                    if seq == END_SEQ or seq >= stop:
                        return expected == stop
                    if seq < expected:
                        continue
                    if seq > expected and start > 0:
                        return False  # the publisher's buffer no longer reaches back
                    await self._apply(seq, payload)
                    self.state.replayed += 1
                    expected = seq + 1
        except TimeoutError:
            return False
        finally:
            sock.close(0)


class EngineEvents:
    """All subscribers of one router; owned by the app's lifespan.

    The static replicas' sources are given at construction; a replica joining at run time
    gets its own from ``config`` (``joined``), and one leaving has its subscribers stopped
    and what its events put in the trackers dropped (``left``; the membership then makes
    the index forget the replica).
    """

    def __init__(self, sources: Sequence[EventSource], ingest: KvIngest, *, topic: str = "",
                 clock: Callable[[], float] = time.monotonic,
                 config: EventConfig | None = None) -> None:
        self.ingest = ingest
        self.config = config
        self._topic = topic
        self._clock = clock
        self.ranks: dict[ReplicaId, list[SourceState]] = {}
        self.states: dict[ReplicaId, SourceState] = {}  # rank 0's
        self._ctx: zmq.asyncio.Context | None = None
        self._tasks: dict[ReplicaId, list[asyncio.Task[None]]] = {}
        self._add(sources)

    def _add(self, sources: Sequence[EventSource]) -> list[SourceState]:
        added = [SourceState(source) for source in sources]
        for state in added:
            self.ranks.setdefault(state.source.replica, []).append(state)
            self.states.setdefault(state.source.replica, state)
        return added

    def _subscribe(self, states: Sequence[SourceState]) -> None:
        if not states:
            return
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        for state in states:
            sub = Subscriber(self._ctx, state, self.ingest, self._topic)
            self._tasks.setdefault(state.source.replica, []).append(
                asyncio.create_task(sub.run()))

    def precise(self, replica: ReplicaId) -> bool:
        return any(state.batches > 0 for state in self.ranks.get(replica, ()))

    def status(self, replica: ReplicaId) -> dict[str, object]:
        state = self.states.get(replica)
        mode = "precise" if self.precise(replica) else "approximate"
        out: dict[str, object] = {"mode": mode}
        if state is not None:
            tracked, unresolved = self.ingest.tracked(replica)
            out.update(state.as_json(self._clock()), engine_blocks_tracked=tracked,
                       unresolved_blocks=unresolved)
            ranks = self.ranks[replica]
            if len(ranks) > 1:  # data parallel: rank 0's counters above, every rank's here
                out["ranks"] = [rank.as_json(self._clock()) for rank in ranks]
        return out

    def start(self) -> None:
        self._subscribe([s for ranks in self.ranks.values() for s in ranks])

    def joined(self, replica: ReplicaId) -> None:
        """A replica joined at run time: subscribe to its publishers (from ``config``)."""
        if self.config is None or replica in self.ranks:
            return
        try:
            sources = self.config.sources_for(replica)
        except ValueError as exc:  # a template that gives this URL no valid port
            log.warning("replica %s: no KV-event source: %s", replica, exc)
            return
        self._subscribe(self._add(sources))

    async def left(self, replica: ReplicaId) -> None:
        """A replica left: stop its subscribers, drop its trackers (the index entries are
        the membership's to forget, after this)."""
        await cancel_all(self._tasks.pop(replica, []))
        self.ranks.pop(replica, None)
        self.states.pop(replica, None)
        self.ingest.drop(replica)

    async def stop(self) -> None:
        for tasks in self._tasks.values():
            await cancel_all(tasks)
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
