"""The cost model: predicted time to first token of a request on a replica.

    ttft(r) = wait(r) + pool_load(m) + prefill(c, n)        (each term calibrated)

- ``prefill(c, n) = f + a*n + b*((c+n)^2 - c^2)``: ``n`` uncached tokens after ``c``
  cached ones. Linear work per token plus attention against everything before it, so a
  long context costs superlinearly (the study: 31.7 s at 128k, 92.0 s at 256k).
- ``pool_load(m) = L0 + m * t_tok`` for ``m > 0`` tokens loaded from the shared pool
  (``t_tok`` = KV bytes per token / pool bandwidth), else 0.
- ``c`` = the longer of the prefix on r's GPU and the prefix in the pool; ``m`` = the part
  of the pool prefix beyond r's GPU prefix; ``n`` = the rest of the prompt. The engine
  always computes the last prompt token, so ``c <= prompt - 1``.
- ``wait(r)``: prefill work already admitted ahead of us on r (``policies.locality``'s queue).
- calibration (``policies.calibration``) scales each of these terms for the fleet, and
  prefill and load for each replica, from observed service times; 1.0 until observations
  arrive. It absorbs a different GPU, model, or an emulator's time scale, and a prior
  wrong in one term, without touching the prior.

The prior is the policy's belief, read from a prior file (``load_prior``: the keys of a
simulator profile, of which only the timing fields are read). ``STUDY_PRIOR`` comes from
the built-in ``policies/priors/study-27b.toml``, the fit of docs/model.md (27B hybrid
model, FP8 KV, 32 KiB per token, H200): cold 128k prefill 31.7 s, pool hit 0.605 s;
``--policy locality@prior=PATH`` picks another. Apart from reading that file once, the
model is pure arithmetic, no I/O.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The keys of a prior file: those of a simulator profile. Only the timing ones are read.
PRIOR_KEYS = frozenset({
    "name", "chunk_tokens", "bytes_per_token", "gpu_kv_bytes", "pool_bytes",
    "prefill_fixed_s", "prefill_token_s", "prefill_token2_s", "load_fixed_s",
    "load_bytes_per_s", "store_bytes_per_s", "tpot_s", "tpot_context_s", "base",
    "queued_fixed_share",
})
# The built-in prior (package data): the study fit of docs/model.md.
PRIORS_DIR = Path(__file__).parent / "priors"
DEFAULT_PRIOR_FILE = PRIORS_DIR / "study-27b.toml"


class PriorError(ValueError):
    """A prior file that cannot be read, or with an unknown key or a bad value."""


@dataclass(frozen=True, slots=True)
class CostParams:
    """Prior cost parameters, in seconds (per token where named so); ``name`` and ``source``
    (the file it was read from) say which prior it is."""

    prefill_fixed_s: float
    prefill_token_s: float
    prefill_token2_s: float
    load_fixed_s: float
    load_token_s: float
    name: str = ""
    source: str = ""

    @classmethod
    def from_option(cls, value: Any) -> CostParams:
        """``locality@prior=PATH``: a TOML or JSON prior file (see ``load_prior``)."""
        return load_prior(str(value))

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any], *, source: str) -> CostParams:
        """The prior in a profile's fields (a prior file's, or a simulator ``Profile``'s):
        only the timing ones; ``load_token_s`` is ``bytes_per_token / load_bytes_per_s``."""
        return cls(
            prefill_fixed_s=float(fields["prefill_fixed_s"]),
            prefill_token_s=float(fields["prefill_token_s"]),
            prefill_token2_s=float(fields["prefill_token2_s"]),
            load_fixed_s=float(fields["load_fixed_s"]),
            load_token_s=fields["bytes_per_token"] / fields["load_bytes_per_s"],
            name=str(fields.get("name", "")),
            source=source,
        )

    def _prefill_terms(self, cached: int, new: int) -> tuple[float, float, float]:
        if new <= 0:
            return self.prefill_fixed_s, 0.0, 0.0
        total = cached + new
        return (self.prefill_fixed_s, self.prefill_token_s * new,
                self.prefill_token2_s * (total * total - cached * cached))

    def prefill_s(self, cached: int, new: int) -> float:
        fixed, linear, attention = self._prefill_terms(cached, new)
        return fixed + linear + attention

    def pool_load_s(self, tokens: int) -> float:
        return 0.0 if tokens <= 0 else self.load_fixed_s + tokens * self.load_token_s

    def terms(self, cached: int, new: int, loaded: int) -> tuple[float, float, float, float]:
        """The prediction's parts, seconds: prefill fixed, linear, attention; pool load.
        ``prefill_s(cached, new) + pool_load_s(loaded)`` is their sum."""
        return (*self._prefill_terms(cached, new), self.pool_load_s(loaded))


def _read_prior(text: bytes, where: str, toml: bool) -> dict[str, Any]:
    try:
        data = tomllib.loads(text.decode()) if toml else json.loads(text)
    except ValueError as exc:  # TOMLDecodeError, JSONDecodeError, UnicodeDecodeError
        raise PriorError(f"{where}: not valid {'TOML' if toml else 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise PriorError(f"{where}: must hold a table of profile keys")
    for key, value in data.items():
        if key not in PRIOR_KEYS:
            raise PriorError(f"{where}: unknown key {key!r}; known: {sorted(PRIOR_KEYS)}")
        if key in ("name", "base"):
            if not isinstance(value, str):
                raise PriorError(f"{where}: key {key!r} must be a string, not {value!r}")
            if key == "base" and not (PRIORS_DIR / f"{value}.toml").is_file():
                raise PriorError(f"{where}: key 'base' names no built-in prior: {value!r}; "
                                 f"known: {sorted(p.stem for p in PRIORS_DIR.glob('*.toml'))}")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not (
                math.isfinite(value) and value >= 0):
            raise PriorError(f"{where}: key {key!r} must be a number >= 0, not {value!r}")
    if data.get("load_bytes_per_s") == 0:
        raise PriorError(f"{where}: key 'load_bytes_per_s' must be > 0")
    return data


def _builtin_fields(base: str) -> dict[str, Any]:
    path = PRIORS_DIR / f"{base}.toml"
    return _read_prior(path.read_bytes(), str(path), toml=True)


def load_prior(path: str | Path | None = None) -> CostParams:
    """The prior in a TOML (``.toml``) or JSON file; ``None``: the built-in study fit.

    Fields the file leaves out come from ``base`` (a built-in prior in ``policies/priors/``,
    default ``study-27b``), so a simulator profile file that inherits from ``study-27b`` reads
    as a prior too (``CostParams.from_fields``). Raises ``PriorError`` naming the bad key."""
    source = Path(path) if path is not None else DEFAULT_PRIOR_FILE
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise PriorError(f"{source}: cannot read it: {exc.strerror or exc}") from None
    own = _read_prior(raw, str(source), toml=source.suffix != ".json")
    base = str(own.get("base", DEFAULT_PRIOR_FILE.stem))
    fields = own if path is None else {**_builtin_fields(base), "name": source.stem, **own}
    return CostParams.from_fields(fields, source=str(source))


STUDY_PRIOR = load_prior()


@dataclass(slots=True)
class Estimate:
    """A predicted TTFT and its parts, for one request on one replica (the policy makes
    one per candidate per request: where mypyc compiles this module, setup.py, a native
    class, built and read without the interpreter, which a named tuple is not)."""

    replica: str
    wait_s: float
    load_s: float
    prefill_s: float
    gpu_tokens: int
    pool_tokens: int
    new_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.wait_s + self.load_s + self.prefill_s


def split_tokens(prompt: int, gpu: int, pool: int) -> tuple[int, int, int]:
    """(tokens on this GPU, tokens to load from the pool, tokens to prefill): at most all
    but the prompt's last token cached. (Conditionals, not ``min``/``max`` calls: it runs
    for every candidate of every decision.)"""
    cap = prompt - 1 if prompt > 0 else 0
    g = gpu if gpu < cap else cap
    c = pool if pool > g else g
    if c > cap:
        c = cap
    return g, c - g, prompt - c
