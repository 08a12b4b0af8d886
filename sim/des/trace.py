"""Mooncake-format trace replay: JSONL records -> an open-loop workload of model chains.

Format (kvcache-ai/Mooncake FAST'25 traces): one JSON object per line with ``timestamp``
(arrival, ms), ``input_length`` and ``output_length`` (tokens) and ``hash_ids``: one id per
512-token block of the input, remapped prefix hashes, so an equal id at the same position
means the whole prefix up to the end of that block is shared.

Mapping onto the model's chain (chunks of ``B`` tokens, 1,568 in the study profile):
chunk ``j`` covers tokens ``[0, (j+1)B)``; it is reusable exactly when the prefix through
the 512-block holding its last token is, so its key is that block's id,
``hash_ids[((j+1)B - 1) // 512]``, offset by ``TRACE_KEY_BASE`` to stay apart from
generated keys. Only whole chunks count (``input_length // B`` of them), as the model
caches whole chunks. The mapping is conservative: two requests sharing 4 blocks (2,048
tokens) share one 1,568-token chunk; a share ending mid-chunk is lost, as in LMCache.

Session key (what ``fixed``/``alternating`` stick to): the first two block ids. Every
request of this trace starts with block 0 (a common system prompt); the second block is
the conversation's first message, the trace's stand-in for the router's default session
hash (system prompt + first user message). ``time_scale`` divides inter-arrival times
(2.0 replays the hour in half an hour: twice the load).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sim.des.workload import OpenLoop, SimRequest

TRACE_BLOCK_TOKENS = 512
TRACE_KEY_BASE = 1 << 48
# Traces shipped with the package (sim/des/traces/README.md says where each comes from).
BUILTIN_TRACES = {"mooncake": "mooncake_conversation.jsonl.gz",
                  "mooncake-synthetic": "mooncake_synthetic.jsonl.gz"}


@dataclass(frozen=True, slots=True)
class TraceRecord:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


class TraceFormatError(ValueError):
    """A line that is not a Mooncake-format record."""


def parse_lines(lines: Iterable[str]) -> list[TraceRecord]:
    out: list[TraceRecord] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            rec = TraceRecord(float(obj["timestamp"]), int(obj["input_length"]),
                              int(obj["output_length"]), tuple(int(h) for h in obj["hash_ids"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceFormatError(f"line {n}: {exc}") from None
        if rec.input_length < 1:
            raise TraceFormatError(f"line {n}: input_length must be positive")
        out.append(rec)
    return out


def trace_path(name_or_path: str | Path) -> Path:
    """A shipped trace's file by name (``mooncake``), else the path as given."""
    name = str(name_or_path)
    if name in BUILTIN_TRACES:
        return Path(str(resources.files("sim.des") / "traces" / BUILTIN_TRACES[name]))
    return Path(name_or_path)


def load_trace(name_or_path: str | Path, limit: int | None = None) -> list[TraceRecord]:
    """Records of a shipped trace (by name) or of a JSONL file, gzip-compressed if ``.gz``."""
    path = trace_path(name_or_path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        records = parse_lines(fh)
    return records[:limit] if limit is not None else records


def chunk_chain(hash_ids: Sequence[int], input_length: int, chunk: int,
                block: int = TRACE_BLOCK_TOKENS) -> tuple[int, ...]:
    """Model chunk keys for one record (see the module docstring)."""
    keys: list[int] = []
    for j in range(input_length // chunk):
        k = ((j + 1) * chunk - 1) // block
        if k >= len(hash_ids):
            break
        keys.append(TRACE_KEY_BASE + hash_ids[k])
    return tuple(keys)


def session_key(hash_ids: Sequence[int]) -> str:
    return "t" + "-".join(str(h) for h in hash_ids[:2])


def trace_workload(records: Sequence[TraceRecord], chunk: int, *, time_scale: float = 1.0,
                   tag: str = "trace") -> OpenLoop:
    """An open-loop replay; arrival offsets relative to the first record."""
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    if not records:
        return OpenLoop([])
    t0 = min(r.timestamp_ms for r in records)
    arrivals = []
    for i, r in enumerate(records):
        req = SimRequest(f"trace/{i}", session_key(r.hash_ids),
                         chunk_chain(r.hash_ids, r.input_length, chunk), r.input_length,
                         max(1, r.output_length), tag, 0, i)
        arrivals.append(((r.timestamp_ms - t0) / 1000.0 / time_scale, req))
    return OpenLoop(arrivals)
