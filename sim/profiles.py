"""Named timing profiles for the replica model (frozen dataclasses).

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
  scatter. REFERENCE.md reads the study's hits as ~0.4 s fixed + ~23 GB/s; the joint fit
  splits that 0.4 s into the per-request ``prefill_fixed_s`` (every request pays it,
  hit or miss) and a smaller load overhead, at ~25 GB/s: under half the 55 GB/s a
  pinned host-to-GPU copy reaches on the H200.
- pool store of ``m`` new tokens: ``m * bytes_per_token / store_bytes_per_s``; LMCache
  saves at the end of the forward pass, so it delays the first token. This is the study's
  small fixed-placement cost of turning the pool on (+0.36 % / +0.34 %).
- decode: time per output token ``tpot_s + tpot_context_s * K`` where ``K`` is the KV the
  step reads, in tokens (the contexts of every sequence decoding in the batch): decode is
  memory-bound, weights once per step plus every sequence's KV.

Capacities: ``chunk_tokens`` is the block size of every chain (the pool's chunk, and the
granularity at which the GPU cache is matched); ``gpu_kv_bytes`` and ``pool_bytes`` give
the GPU cache and pool capacities in blocks via ``chunk_bytes``.

See docs/model.md for how ``study-27b`` was fitted and its residuals.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.pool import SharedPool

GIB = 1 << 30


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

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_tokens * self.bytes_per_token

    @property
    def gpu_capacity_blocks(self) -> int:
        return max(1, self.gpu_kv_bytes // self.chunk_bytes)

    def prefill_s(self, cached: int, new: int) -> float:
        """Compute time for ``new`` tokens after ``cached`` tokens already in KV."""
        total = cached + new
        return (
            self.prefill_fixed_s
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


# The study (DESIGN.md): 27B hybrid model, FP8 KV, one H200 per replica, LMCache chunks of
# 1,568 tokens, 256 GiB pool. 32 KiB/token: the full-attention layers alone hold KV (the
# linear-attention layers keep a fixed-size state per sequence); 16 of them x 4 KV heads
# x head dim 256 x (K and V) x 1 byte = 32,768 B, and 128k tokens x 32 KiB = 4 GiB as
# REFERENCE.md states. GPU KV space: 141 GB card - ~54 GB of bf16 weights - activations
# and the linear-attention states ~ 64 GiB. Decode: 54 GB of weights / 4.8 TB/s HBM = 11 ms
# a step at best, ~18 ms in practice, plus 32 KiB / 4.8 TB/s = 6.8 ns per token of KV read.
# Fitted numbers (prefill, load, store; the per-request 0.25 s covers the front end's
# tokenization and scheduling of a long prompt): docs/model.md.
STUDY_27B = Profile(
    name="study-27b",
    chunk_tokens=1568,
    bytes_per_token=32 * 1024,
    gpu_kv_bytes=64 * GIB,
    pool_bytes=256 * GIB,
    prefill_fixed_s=0.25,
    prefill_token_s=1.2567e-4,
    prefill_token2_s=8.583e-10,
    load_fixed_s=0.160,
    load_bytes_per_s=25.0e9,
    store_bytes_per_s=36e9,
    tpot_s=0.018,
    tpot_context_s=6.8e-9,
)

# Small and fast, for tests: 16-token blocks, 1 KiB/token, room for 64 GPU blocks and 256
# pool chunks; a cold 1,024-token prefill takes ~0.11 s and a pool hit ~0.01 s.
TINY = Profile(
    name="tiny",
    chunk_tokens=16,
    bytes_per_token=1024,
    gpu_kv_bytes=64 * 16 * 1024,
    pool_bytes=256 * 16 * 1024,
    prefill_fixed_s=0.001,
    prefill_token_s=1e-4,
    prefill_token2_s=1e-8,
    load_fixed_s=0.005,
    load_bytes_per_s=1e9,
    store_bytes_per_s=4e9,
    tpot_s=0.001,
    tpot_context_s=1e-7,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (STUDY_27B, TINY)}


def get_profile(name: str) -> Profile:
    """The named profile; ``KeyError`` lists the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown profile {name!r}; known: {sorted(PROFILES)}") from None
