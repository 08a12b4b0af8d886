"""Engine KV events -> our block keys: decoding vLLM's payloads and tracking engine chains.

Decoding (``decode_payload``). A payload is msgpack ``[ts, events, data_parallel_rank]``
(or, from newer vLLM, a map of those names).
Each event is either a map with ``"type"`` (vLLM >= PR #42892: msgspec tagged structs)
or, before, a positional array ``[tag, field, ...]`` in the struct's field order. Both
become ``Stored`` / ``Removed`` / ``Cleared``; unknown event types are skipped.

Tracking (``ChainTracker``). vLLM names a block by its own hash (sha256-based, chained
over the parent) and its blocks hold 16-128 tokens; our keys (``router.prefix``) cover
``block_tokens`` (256 by default) tokens and are xxh3 chained from ``root_key(model, salt, lora)``.
We never reproduce vLLM's hash: we recompute ours from the token ids a ``BlockStored``
carries. Per engine hash the tracker keeps its parent's engine hash, its own tokens
(``pack_token_ids``: the bytes ``token_chain`` hashes), ``end`` (tokens from the
chain start through this block) and ``key`` (our key of the last of our blocks completed
at or before ``end``, the root if none). A stored engine block that crosses a multiple of
``block_tokens`` completes one of our blocks: its bytes are gathered by walking parent
links back over the engine blocks it spans (any block size; they need not divide 256), its
key is ``xxh3_64(bytes, seed=previous key)``, and every engine block it spans records
that key as an *owner*, so that a later ``BlockRemoved`` of any of them evicts our block
(the engine no longer holds all of it). A store whose parent is unknown (we joined late,
or it aged out) cannot be keyed and is counted as unresolved. Per key of ours the tracker
counts the engine blocks it spans and those still stored, so ``holds(key)`` says whether
this scope still has all of it (a replica with several scopes, DP ranks or a local CPU
tier, keeps a key while any scope holds it).

Memory is bounded: at most ``max_blocks`` engine blocks per tracker, least recently
stored dropped first (~(tokens x 4 + 150) bytes each). A block whose ``extra_keys`` hold
multimodal identifiers is unresolved too (token ids alone do not name its content); a
bare string in the first block's ``extra_keys`` other than the LoRA name is the request's
``cache_salt`` and goes into the root, as the request side does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from router.prefix import BlockKey, bytes_chain, pack_token_ids

EngineHash = Hashable  # int (uint64) today; bytes in some vLLM versions


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: Sequence[int]
    block_size: int
    medium: str
    lora_name: str | None = None
    extra_keys: Sequence[Any] | None = None
    group_idx: int | None = None
    kind: str | None = None
    locality: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[EngineHash, ...]
    medium: str
    group_idx: int | None = None
    locality: str | None = None


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared

# Field order of vLLM's structs, for the positional (array) encoding.
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def _hashes(value: Any) -> tuple[EngineHash, ...]:
    return tuple(value) if isinstance(value, list | tuple) else ()


def decode_event(raw: Any) -> Event | None:
    """One event in either encoding; ``None`` for a type we do not index."""
    if isinstance(raw, dict):
        tag, fields = raw.get("type"), raw
    elif isinstance(raw, list | tuple) and raw:
        tag = raw[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        return None
    medium = str(fields.get("medium") or "GPU")
    locality = fields.get("locality")
    locality = str(locality) if locality is not None else None
    if tag == "BlockStored":
        return Stored(
            hashes=_hashes(fields.get("block_hashes")),
            parent=fields.get("parent_block_hash"),
            token_ids=fields.get("token_ids") or [],
            block_size=int(fields.get("block_size") or 0),
            medium=medium,
            lora_name=fields.get("lora_name"),
            extra_keys=fields.get("extra_keys"),
            group_idx=fields.get("group_idx"),
            kind=fields.get("kv_cache_spec_kind"),
            locality=locality,
        )
    if tag == "BlockRemoved":
        return Removed(_hashes(fields.get("block_hashes")), medium, fields.get("group_idx"),
                       locality)
    if tag == "AllBlocksCleared":
        return Cleared()
    return None


def decode_payload(payload: bytes) -> tuple[float, list[Event]]:
    """A batch -> (ts, events); raises ValueError on a malformed payload.

    vLLM's ``EventBatch`` was an array-like struct, ``[ts, events, data_parallel_rank]``
    (vLLM <= 0.32 as observed); newer vLLM drops ``array_like`` from it, so the batch
    comes as a map ``{"ts", "events", "data_parallel_rank"}``. Both are read.
    """
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise ValueError(f"undecodable KV-event payload: {exc!r}") from exc
    if isinstance(batch, dict):
        batch = [batch.get("ts"), batch.get("events")]
    if not isinstance(batch, list | tuple) or len(batch) < 2 or not isinstance(batch[1], list) \
            or not isinstance(batch[0], int | float):
        raise ValueError("KV-event payload is not [ts, events, rank] or {ts, events, ...}")
    events = [e for e in (decode_event(raw) for raw in batch[1]) if e is not None]
    return float(batch[0]), events


def root_salt(event: Stored) -> tuple[str | None, bool]:
    """(cache_salt of a chain-start store, whether its blocks are keyable from token ids)."""
    salt: str | None = None
    for i, keys in enumerate(event.extra_keys or ()):
        for key in keys or ():
            if isinstance(key, list | tuple):
                return None, False  # multimodal (identifier, offset): not in the token ids
            if i == 0 and isinstance(key, str) and key != event.lora_name:
                salt = key
    return salt, True


@dataclass(slots=True)
class _Block:
    parent: EngineHash | None
    data: bytes  # this engine block's token ids, packed
    end: int  # tokens from the chain start through this block
    key: BlockKey | None  # last completed key of ours at or before ``end``; None: unknown
    owners: tuple[BlockKey, ...] = field(default=())


class ChainTracker:
    """Engine hash -> our keys, for one scope (a replica's GPU cache, or the shared pool)."""

    def __init__(self, block_tokens: int, max_blocks: int = 131_072) -> None:
        if block_tokens <= 0 or max_blocks <= 0:
            raise ValueError("block_tokens and max_blocks must be positive")
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self.unresolved = 0  # engine blocks stored that could not be keyed
        self._blocks: OrderedDict[EngineHash, _Block] = OrderedDict()
        # Per key of ours: engine blocks it spans (at completion) and how many are held.
        self._span: dict[BlockKey, int] = {}
        self._held: dict[BlockKey, int] = {}
        # An offloaded chunk named by its last engine block -> all its blocks (``adopt``).
        self._chunks: dict[EngineHash, list[EngineHash]] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        self._blocks.clear()
        self._span.clear()
        self._held.clear()
        self._chunks.clear()

    def holds(self, key: BlockKey) -> bool:
        """Whether every engine block of our ``key`` is still stored in this scope."""
        held = self._held.get(key, 0)
        return held > 0 and held >= self._span.get(key, 0)

    def held_keys(self) -> list[BlockKey]:
        """Our keys with at least one engine block stored here."""
        return list(self._held)

    def _drop(self, block: _Block) -> None:
        for key in block.owners:
            left = self._held.get(key, 0) - 1
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)
                self._span.pop(key, None)

    def _tail(self, last: EngineHash, start: int, stop: int) -> tuple[bytes, list[_Block]] | None:
        """Bytes of tokens [start, stop) ending in engine block ``last``, and its blocks."""
        pieces: list[bytes] = []
        members: list[_Block] = []
        node: EngineHash | None = last
        while node is not None:
            block = self._blocks.get(node)
            if block is None:
                return None
            begin = block.end - len(block.data) // 4
            if begin < stop:
                lo, hi = max(begin, start) - begin, min(block.end, stop) - begin
                pieces.append(block.data[4 * lo : 4 * hi])
                members.append(block)
            if begin <= start:
                pieces.reverse()
                return b"".join(pieces), members
            node = block.parent
        return None

    def store(self, event: Stored, root: BlockKey) -> list[BlockKey]:
        """Apply a ``BlockStored``; returns our keys it completed, in chain order."""
        n = len(event.hashes)
        size = event.block_size or (len(event.token_ids) // max(n, 1))
        if n == 0 or size <= 0 or len(event.token_ids) != n * size:
            self.unresolved += n
            return []
        key: BlockKey | None
        if event.parent is None:
            end, key = 0, root
        else:
            parent = self._blocks.get(event.parent)
            end, key = (parent.end, parent.key) if parent is not None else (0, None)
        prev = event.parent
        done: list[BlockKey] = []
        step = self.block_tokens
        for i, engine_hash in enumerate(event.hashes):
            begin, end = end, end + size
            known = self._blocks.pop(engine_hash, None)
            keep = known is not None and known.end == end
            if known is not None and not keep:
                self._drop(known)
            block = _Block(prev, pack_token_ids(event.token_ids[i * size : (i + 1) * size]), end, key,
                           known.owners if known is not None and keep else ())
            self._blocks[engine_hash] = block
            if key is None:
                self.unresolved += 1
            else:
                for boundary in range((begin // step + 1) * step, end + 1, step):
                    found = self._tail(engine_hash, boundary - step, boundary)
                    if found is None:
                        key = None
                        self.unresolved += 1
                        break
                    data, members = found
                    key = bytes_chain(data, key, len(data))[0]
                    done.append(key)
                    self._span[key] = len(members)
                    for member in members:
                        if key not in member.owners:
                            member.owners += (key,)
                            self._held[key] = self._held.get(key, 0) + 1
            block.key = key
            prev = engine_hash
        self._bound()
        return done

    def _bound(self) -> None:
        while len(self._blocks) > self.max_blocks:
            engine_hash, block = self._blocks.popitem(last=False)
            self._chunks.pop(engine_hash, None)
            self._drop(block)

    def adopt(self, source: ChainTracker, event: Stored) -> list[BlockKey] | None:
        """Hold here (a replica's CPU-offload scope) blocks ``source`` (its GPU scope)
        already keyed; our keys now whole here, or None if ``source`` lacks the last one.

        vLLM's OffloadingConnector names an offloaded chunk by the hash of its last GPU
        block and, by default, sends no token ids, parent or size (a placeholder): the chunk
        is then that block and its ancestors back to a block held here (the previous
        chunk) or the chain start. With ``self_describing_kv_events`` it lists every block
        of the chunk, with their tokens: exactly those. Keys come from ``source``, so a
        salted or LoRA chain keeps its root (the offload event's ``extra_keys`` are None).
        """
        if not event.hashes or event.hashes[-1] not in source._blocks:
            return None
        members = [h for h in event.hashes if h in source._blocks]
        if not event.token_ids:  # placeholder: walk back to the previous chunk
            members, node = [], event.hashes[-1]
            while node is not None and node not in self._blocks and node in source._blocks:
                members.append(node)
                node = source._blocks[node].parent
            members.reverse()
        self._chunks[event.hashes[-1]] = members
        touched: list[BlockKey] = []
        for engine_hash in members:
            if engine_hash in self._blocks:  # announced again by an overlapping chunk
                continue
            src = source._blocks[engine_hash]
            self._blocks[engine_hash] = _Block(src.parent, src.data, src.end, src.key, src.owners)
            for key in src.owners:
                self._held[key] = self._held.get(key, 0) + 1
                self._span[key] = source._span.get(key, 0)
                if key not in touched:
                    touched.append(key)
        self._bound()
        return [k for k in touched if self.holds(k)]

    def remove(self, hashes: Sequence[EngineHash]) -> list[BlockKey]:
        """Apply a ``BlockRemoved``; returns our keys no longer whole in this scope."""
        out: list[BlockKey] = []
        members = [m for h in hashes for m in self._chunks.pop(h, [h])]  # a chunk: all of it
        for engine_hash in members:
            block = self._blocks.pop(engine_hash, None)
            if block is not None:
                self._drop(block)
                out.extend(k for k in block.owners if k not in out)
        return out
