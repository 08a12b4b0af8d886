"""The cost model: predicted time to first token of a request on a replica.

    ttft(r) = wait(r) + s_load(r) * pool_load(m) + s_prefill(r) * prefill(c, n)

- ``prefill(c, n) = f + a*n + b*((c+n)^2 - c^2)``: ``n`` uncached tokens after ``c``
  cached ones. Linear work per token plus attention against everything before it, so a
  long context costs superlinearly (the study: 31.7 s at 128k, 92.0 s at 256k).
- ``pool_load(m) = L0 + m * t_tok`` for ``m > 0`` tokens loaded from the shared pool
  (``t_tok`` = KV bytes per token / pool bandwidth), else 0.
- ``c`` = the longer of the prefix on r's GPU and the prefix in the pool; ``m`` = the part
  of the pool prefix beyond r's GPU prefix; ``n`` = the rest of the prompt. The engine
  always computes the last prompt token, so ``c <= prompt - 1``.
- ``wait(r)``: prefill work already admitted ahead of us on r (``PendingWork``).
- ``s_prefill(r)``, ``s_load(r)``: per-replica calibration factors (``Calibration``), 1.0
  until observations arrive; they absorb a different GPU, model, or an emulator's time
  scale without touching the prior.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The keys of a prior file: those of a simulator profile. Only the timing ones are read.
PRIOR_KEYS = frozenset({
    "name", "chunk_tokens", "bytes_per_token", "gpu_kv_bytes", "pool_bytes",
    "prefill_fixed_s", "prefill_token_s", "prefill_token2_s", "load_fixed_s",
    "load_bytes_per_s", "store_bytes_per_s", "tpot_s", "tpot_context_s", "base",
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

    def prefill_s(self, cached: int, new: int) -> float:
        if new <= 0:
            return self.prefill_fixed_s
        total = cached + new
        return (self.prefill_fixed_s + self.prefill_token_s * new
                + self.prefill_token2_s * (total * total - cached * cached))

    def pool_load_s(self, tokens: int) -> float:
        return 0.0 if tokens <= 0 else self.load_fixed_s + tokens * self.load_token_s


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
    as a prior too; ``load_token_s`` is
    ``bytes_per_token / load_bytes_per_s``. Raises ``PriorError`` naming the bad key."""
    source = Path(path) if path is not None else DEFAULT_PRIOR_FILE
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise PriorError(f"{source}: cannot read it: {exc.strerror or exc}") from None
    own = _read_prior(raw, str(source), toml=source.suffix != ".json")
    base = str(own.get("base", DEFAULT_PRIOR_FILE.stem))
    fields = own if path is None else {**_builtin_fields(base), "name": source.stem, **own}
    return CostParams(
        prefill_fixed_s=float(fields["prefill_fixed_s"]),
        prefill_token_s=float(fields["prefill_token_s"]),
        prefill_token2_s=float(fields["prefill_token2_s"]),
        load_fixed_s=float(fields["load_fixed_s"]),
        load_token_s=fields["bytes_per_token"] / fields["load_bytes_per_s"],
        name=str(fields.get("name", "")),
        source=str(source),
    )


STUDY_PRIOR = load_prior()


@dataclass(frozen=True, slots=True)
class Estimate:
    """A predicted TTFT and its parts, for one request on one replica."""

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
    """(tokens on this GPU, tokens to load from the pool, tokens to prefill)."""
    cap = max(0, prompt - 1)
    g = min(gpu, cap)
    c = min(max(g, pool), cap)
    return g, c - g, prompt - c


@dataclass(slots=True)
class Calibration:
    """Multiplicative corrections to the prior, learned online from observed service times.

    An observation is a service time (pool load + prefill, no queueing) on a replica;
    its residual is ``r = log(observed / predicted)`` with the factors as they are now.
    Factors: ``exp(G + P_r)`` for prefill and ``exp(G + L_r)`` for pool loads.

    - ``G``, the fleet's scale (another GPU or model than the prior's, or an emulator's
      time scale), is the running mean of ``r`` over the first ``warmup`` observations,
      then an EWMA with step ``alpha / 2``.
    - ``P_r`` and ``L_r``, one replica's deviation from the fleet, follow an EWMA with
      step ``alpha / 2`` split by each part's share of the predicted service time, so
      pool hits teach pool bandwidth and misses prefill throughput; they are bounded by
      ``±log(max_deviation)``. The bound matters: a replica whose first replies were slow
      would otherwise look slow for good, get no traffic, and never be corrected.

    Residuals are clipped to ``±log(clip)`` after warm-up, so one outlier moves little.
    Residuals use the current factors, not the ones of the prediction at dispatch: with a
    long queue many requests are in flight between a prediction and its observation, and
    correcting each stale prediction in full would integrate one error many times over
    (wind-up; the simulator showed factors diverging at overload before this was fixed).
    """

    alpha: float = 0.2
    warmup: int = 3
    clip: float = 4.0
    max_deviation: float = 2.0
    log_global: float = 0.0
    observations: int = 0
    log_prefill: dict[str, float] = field(default_factory=dict)
    log_load: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)

    def prefill_scale(self, replica: str) -> float:
        return math.exp(self.log_global + self.log_prefill.get(replica, 0.0))

    def load_scale(self, replica: str) -> float:
        return math.exp(self.log_global + self.log_load.get(replica, 0.0))

    def update(self, replica: str, prior_load_s: float, prior_prefill_s: float,
               observed_s: float) -> float | None:
        """Fold one observed service time in; returns the residual it carried."""
        load = prior_load_s * self.load_scale(replica)
        prefill = prior_prefill_s * self.prefill_scale(replica)
        service = load + prefill
        if service <= 0 or observed_s <= 0:
            return None
        r = math.log(observed_s / service)
        self.observations += 1
        self.count[replica] = self.count.get(replica, 0) + 1
        if self.observations <= self.warmup:
            self.log_global += r / self.observations
            return r
        r = max(-math.log(self.clip), min(math.log(self.clip), r))
        step = self.alpha / 2
        self.log_global += step * r
        bound = math.log(self.max_deviation)
        share_load = load / service
        for table, share in ((self.log_prefill, 1.0 - share_load), (self.log_load, share_load)):
            value = table.get(replica, 0.0) + step * share * r
            table[replica] = max(-bound, min(bound, value))
        return r

    def as_json(self) -> dict[str, object]:
        replicas = sorted(self.count)
        return {"fleet_scale": math.exp(self.log_global), "observations": self.observations,
                "replicas": {rid: {"prefill_scale": self.prefill_scale(rid),
                                   "load_scale": self.load_scale(rid),
                                   "observations": self.count[rid]} for rid in replicas}}
