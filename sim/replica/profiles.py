"""Replica timing profiles: the ``Profile`` dataclass and its loader (built-in TOML or a file).

Cost model (all times in seconds, token counts in tokens):

- prefill of ``n`` uncached tokens after ``c`` cached ones::

      prefill(c, n) = prefill_fixed_s + prefill_token_s * n
                      + prefill_token2_s * ((c + n)**2 - c**2)

  The linear term is the per-token work (weights, MLPs, the hybrid's linear-attention
  layers); the quadratic term is causal attention, whose cost for ``n`` new queries over
  ``c + n`` keys is the difference of two triangles. It is what makes a miss at depth
  expensive and a cold 256k prefill ~2.9x a cold 128k one (the study: 92.047 / 31.715).
- pool load of ``m`` tokens: ``load_fixed_s + m * bytes_per_token / load_bytes_per_s``
  (0 when ``m == 0``). The fixed part is LMCache's lookup, allocation and layer-wise
  scatter.
- pool store of ``m`` new tokens: ``m * bytes_per_token / store_bytes_per_s``; LMCache
  saves at the end of the forward pass, so it delays the first token. This is the study's
  small fixed-placement cost of turning the pool on (+0.36 % / +0.34 %).
- decode: time per output token ``tpot_s + tpot_context_s * K`` where ``K`` is the KV the
  step reads, in tokens (the contexts of every sequence decoding in the batch): decode is
  memory-bound, weights once per step plus every sequence's KV.
- batching of queued prefills (``queued_fixed_share``, 0..1, default 1): a prefill that
  waited for the engine (it arrived while another prompt was being computed) pays this
  share of ``prefill_fixed_s``. 1 is an engine that computes one prompt at a time (the
  policy's own queue model); below 1 is an engine whose scheduler packs the prompts
  waiting when a step starts into that step (vLLM's continuous batching with chunked
  prefill): the step's fixed cost is paid once and shared. A planned-at-arrival
  approximation: every queued prompt pays the same share, where the engine charges the
  step's first prompt and the rest little (the sum over a queue is what matters). On
  vLLM 0.32 (CPU, the engine suite's tiny Llama; ``bench/engine_batching.py``,
  docs/engine-batching.json) eight ~1,600-token prompts sharing a cached prefix, sent at
  once: the first answered in 38-49 ms, the rest together at 95-99 ms, where one alone
  takes 24-25 ms (one at a time: 200 ms). Uncached prompts of that length were answered
  one after another, ~70 ms apart: the share applies to the fixed term only.

Capacities: ``chunk_tokens`` is the block size of every chain (the pool's chunk, and the
granularity at which the GPU cache is matched); ``gpu_kv_bytes`` and ``pool_bytes`` give
the GPU cache and pool capacities in blocks via ``chunk_bytes``.

Loading (``load_profile(spec)``): ``spec`` is a built-in name (a TOML file of this
package's ``profiles/`` directory, whose header says what it is fitted to) or the path of
a ``.toml`` or ``.json`` file whose keys are the fields below. A field the file leaves out
is taken from the profile named by its ``base`` key (default ``study-27b``; a built-in
name). Unknown keys, wrong types, negative values and zero where a divisor or a capacity
must be positive raise ``ProfileError`` naming the key. See docs/model.md for how
``study-27b`` was fitted and its residuals.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from sim.replica.pool import SharedPool

GIB = 1 << 30
DEFAULT_BASE = "study-27b"

# Fields that divide or size something: zero is as wrong as negative.
_POSITIVE = {"chunk_tokens", "bytes_per_token", "gpu_kv_bytes", "pool_bytes",
             "load_bytes_per_s", "store_bytes_per_s"}
_SHARES = {"queued_fixed_share"}  # fractions: 0..1


class ProfileError(ValueError):
    """A profile that cannot be loaded: unknown name, unreadable file, bad key or value."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Timing and capacity parameters of one replica type (see the module docstring)."""

    name: str
    chunk_tokens: int
    bytes_per_token: int
    gpu_kv_bytes: int
    pool_bytes: int
    prefill_fixed_s: float
    prefill_token_s: float
    prefill_token2_s: float
    load_fixed_s: float
    load_bytes_per_s: float
    store_bytes_per_s: float
    tpot_s: float
    tpot_context_s: float
    queued_fixed_share: float = 1.0

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_tokens * self.bytes_per_token

    @property
    def gpu_capacity_blocks(self) -> int:
        return max(1, self.gpu_kv_bytes // self.chunk_bytes)

    def prefill_s(self, cached: int, new: int, queued: bool = False) -> float:
        """Compute time for ``new`` tokens after ``cached`` tokens already in KV;
        ``queued``: the prompt waited for the engine (``queued_fixed_share``)."""
        total = cached + new
        return (
            self.prefill_fixed_s * (self.queued_fixed_share if queued else 1.0)
            + self.prefill_token_s * new
            + self.prefill_token2_s * (total * total - cached * cached)
        )

    def pool_load_s(self, tokens: int) -> float:
        """Time to bring ``tokens`` tokens of KV from the pool into GPU memory."""
        if tokens <= 0:
            return 0.0
        return self.load_fixed_s + tokens * self.bytes_per_token / self.load_bytes_per_s

    def pool_store_s(self, tokens: int) -> float:
        """Time the forward pass waits to write ``tokens`` new tokens to the pool."""
        return max(0, tokens) * self.bytes_per_token / self.store_bytes_per_s

    def tpot(self, batch_context_tokens: float) -> float:
        """Seconds per decode step when the batch's sequences hold this many tokens."""
        return self.tpot_s + self.tpot_context_s * batch_context_tokens

    def make_pool(self, *, enabled: bool = True) -> SharedPool:
        """A pool sized and chunked for this profile."""
        return SharedPool(
            self.pool_bytes, self.chunk_tokens, self.bytes_per_token, enabled=enabled
        )


_FIELDS = {f.name: f.type for f in fields(Profile)}
_REQUIRED = {f.name for f in fields(Profile) if f.default is MISSING}  # a built-in names these


def builtin_names() -> list[str]:
    """Names of the profiles shipped as ``profiles/NAME.toml``."""
    folder = resources.files("sim.replica") / "profiles"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def _check(key: str, value: Any) -> Any:
    """``value`` as the type of field ``key``, or ``ProfileError`` naming the key."""
    kind = _FIELDS.get(key)
    if kind is None:
        raise ProfileError(f"unknown profile key {key!r}; known: {', '.join(_FIELDS)}, base")
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise ProfileError(f"profile key {key!r}: expected a non-empty string, got {value!r}")
        return value
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "int" and not (numeric and float(value).is_integer()):
        raise ProfileError(f"profile key {key!r}: expected an integer, got {value!r}")
    if not numeric or value != value:  # NaN compares unequal to itself
        raise ProfileError(f"profile key {key!r}: expected a number, got {value!r}")
    if value < 0 or (value == 0 and key in _POSITIVE):
        need = "positive" if key in _POSITIVE else "non-negative"
        raise ProfileError(f"profile key {key!r}: must be {need}, got {value!r}")
    if key in _SHARES and value > 1:
        raise ProfileError(f"profile key {key!r}: must be at most 1, got {value!r}")
    return int(value) if kind == "int" else float(value)


def _read(path: Path) -> dict[str, Any]:
    """The key/value table of a ``.toml`` or ``.json`` profile file."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:  # tomllib and json errors are ValueErrors
        raise ProfileError(f"profile {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path}: expected a table of keys")
    return data


def from_mapping(data: dict[str, Any], *, source: str = "profile") -> Profile:
    """A profile from ``data``; keys it lacks come from ``data["base"]`` (a built-in)."""
    data = dict(data)
    base_name = data.pop("base", DEFAULT_BASE)
    values: dict[str, Any] = {}
    if set(_FIELDS) - set(data):
        if not isinstance(base_name, str) or base_name not in builtin_names():
            raise ProfileError(f"{source}: profile key 'base': unknown built-in {base_name!r}; "
                               f"known: {', '.join(builtin_names())}")
        values = {f: getattr(_builtin(base_name), f) for f in _FIELDS}
    for key, value in data.items():
        values[key] = _check(key, value)
    return Profile(**values)


def _builtin(name: str) -> Profile:
    path = resources.files("sim.replica") / "profiles" / f"{name}.toml"
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    if _REQUIRED - set(data):
        raise ProfileError(f"built-in profile {name}: missing {sorted(_REQUIRED - set(data))}")
    # Complete by itself (optional keys default): a built-in inherits from no base.
    return Profile(**{key: _check(key, value) for key, value in data.items()})


def load_profile(spec: str) -> Profile:
    """A built-in profile by name, or one read from a ``.toml``/``.json`` file path."""
    if spec in builtin_names():
        return _builtin(spec)
    path = Path(spec)
    if path.suffix.lower() in (".toml", ".json") or path.exists():
        if not path.is_file():
            raise ProfileError(f"profile file {spec} not found")
        return from_mapping(_read(path), source=f"profile {spec}")
    raise ProfileError(f"unknown profile {spec!r}; built-in: {', '.join(builtin_names())}, "
                       "or a .toml/.json file")


STUDY_27B = load_profile("study-27b")
TINY = load_profile("tiny")
