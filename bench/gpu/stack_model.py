"""A 27B-shaped transformer stack with random bf16 weights, for timing only.

Shape (``FULL``): a Qwen3.5-27B-like hybrid as the study describes it: 64 layers, hidden
5,120, SwiGLU MLP 17,408, vocabulary 248,320; every 4th layer (16 of 64) is gated full
attention (24 query heads, 4 KV heads, head dim 256: the profile's 32 KiB/token in FP8);
the other 48 are linear attention (16 key heads and 48 value heads of dim 128), ~26.8B
parameters. The dense stack puts full attention in all 64 layers (~26.3B).

Linear attention is approximated by chunked causal linear attention (chunks of 64 tokens,
an fp32 ``d x d`` state per head carried across chunks, output gated by ``silu(z)``) with
the real layer's projections. Gated DeltaNet adds a decay and the delta rule's triangular
solve inside each chunk (about twice the scan's matrix work) and a 4-tap convolution; the
scan is ~5 MFLOP/token against ~760 MFLOP/token of projections and MLP, so the omission
moves a layer's time by well under the run-to-run spread. What matters to the cost model
is kept: work linear in the tokens, and a fixed-size state per sequence (no KV).

Attention uses PyTorch's fused ``scaled_dot_product_attention`` (flash, cuDNN or
memory-efficient; never the math fallback, which would not fit at 128k). New tokens after
a cached prefix make two fused calls: over the cached keys unmasked, and causally over the
new keys; the two outputs are mixed with fixed weights instead of by their log-sum-exp
(the same matrix work, one elementwise pass less exact). RoPE and q/k norms are left out
(elementwise). MLPs and linear-attention layers run in blocks of ``block`` tokens to bound
activation memory; that changes no arithmetic.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    hidden: int
    inter: int
    vocab: int
    layers: int
    attn_every: int  # a full-attention layer every this many (hybrid)
    heads: int
    kv_heads: int
    head_dim: int
    lin_k_heads: int
    lin_v_heads: int
    lin_dim: int
    block: int  # tokens per MLP / linear-attention block
    chunk: int = 64  # linear-attention chunk


FULL = Shape(5120, 17408, 248320, 64, 4, 24, 4, 256, 16, 48, 128, 16384)
SMALL = Shape(128, 256, 1000, 8, 4, 4, 2, 32, 2, 4, 16, 256, 16)


def _w(rows: int, cols: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, cols, device=device, dtype=dtype) * rows ** -0.5


class Stack:
    """Weights of every layer; ``attention[i]`` says whether layer ``i`` is full attention."""

    def __init__(self, s: Shape, device: torch.device, dtype: torch.dtype) -> None:
        self.s, self.device, self.dtype = s, device, dtype
        h = s.hidden
        self.embed = _w(s.vocab, h, device, dtype)
        self.head = _w(h, s.vocab, device, dtype)
        self.mlp = [(_w(h, 2 * s.inter, device, dtype), _w(s.inter, h, device, dtype))
                    for _ in range(s.layers)]
        qd, kvd = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.attn = [(_w(h, 2 * qd + 2 * kvd, device, dtype), _w(qd, h, device, dtype))
                     for _ in range(s.layers)]
        lin_in = 2 * s.lin_k_heads * s.lin_dim + 2 * s.lin_v_heads * s.lin_dim
        self.lin = [(_w(h, lin_in, device, dtype), _w(s.lin_v_heads * s.lin_dim, h, device, dtype))
                    if (i + 1) % s.attn_every else None for i in range(s.layers)]

    def params(self, dense: bool) -> int:
        n = self.embed.numel() + self.head.numel()
        for i in range(self.s.layers):
            n += sum(w.numel() for w in self.mlp[i])
            full = dense or (i + 1) % self.s.attn_every == 0
            n += sum(w.numel() for w in (self.attn[i] if full else self.lin[i] or ()))
        return n

    def is_attention(self, i: int, dense: bool) -> bool:
        return dense or (i + 1) % self.s.attn_every == 0


def sdpa_context(device: torch.device) -> Any:
    """Fused attention kernels only on CUDA (the math fallback would not fit)."""
    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION])


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],))


def _mlp(st: Stack, i: int, x: torch.Tensor) -> torch.Tensor:
    up, down = st.mlp[i]
    out = torch.empty_like(x)
    for a in range(0, x.shape[0], st.s.block):
        gu = _norm(x[a:a + st.s.block]) @ up
        g, u = gu.chunk(2, dim=-1)
        out[a:a + st.s.block] = x[a:a + st.s.block] + (F.silu(g) * u) @ down
    return out


def _attention(st: Stack, i: int, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
               ) -> torch.Tensor:
    """Gated full attention of ``x``'s tokens after ``cache`` (K, V of the cached prefix)."""
    s = st.s
    w_in, w_out = st.attn[i]
    n, qd, kvd = x.shape[0], s.heads * s.head_dim, s.kv_heads * s.head_dim
    q, gate, k, v = (_norm(x) @ w_in).split([qd, qd, kvd, kvd], dim=-1)
    rep = s.heads // s.kv_heads

    def heads(t: torch.Tensor, nh: int) -> torch.Tensor:  # [T, nh*d] -> [1, heads, T, d]
        t = t.reshape(t.shape[0], nh, s.head_dim).transpose(0, 1)
        return t.repeat_interleave(rep, dim=0)[None] if nh != s.heads else t[None]

    qh = heads(q, s.heads)
    o = F.scaled_dot_product_attention(qh, heads(k, s.kv_heads), heads(v, s.kv_heads),
                                       is_causal=True)
    if cache is not None:
        o_old = F.scaled_dot_product_attention(qh, heads(cache[0], s.kv_heads),
                                               heads(cache[1], s.kv_heads))
        o = 0.5 * (o + o_old)
    o = o[0].transpose(0, 1).reshape(n, qd) * torch.sigmoid(gate)
    return x + o @ w_out


def _linear_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
                 c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked causal linear attention: q, k, v ``[heads, T, d]`` (T a multiple of ``c``)."""
    h, t, d = v.shape
    qc, kc, vc = (a.reshape(h, t // c, c, d) for a in (q, k, v))
    mask = torch.ones(c, c, device=q.device, dtype=torch.bool).tril()
    intra = (qc @ kc.transpose(-1, -2)).masked_fill(~mask, 0) @ vc
    kv = (kc.transpose(-1, -2) @ vc).float()  # [h, nc, d, d]
    states = torch.cumsum(kv, dim=1) - kv + state[:, None]
    inter = qc @ states.to(q.dtype)
    return (intra + inter).reshape(h, t, d), states[:, -1] + kv[:, -1]


def _linear(st: Stack, i: int, x: torch.Tensor) -> torch.Tensor:
    s = st.s
    w_in, w_out = st.lin[i]  # type: ignore[misc]
    kd, vd = s.lin_k_heads * s.lin_dim, s.lin_v_heads * s.lin_dim
    state = torch.randn(s.lin_v_heads, s.lin_dim, s.lin_dim, device=x.device) * 1e-2
    out = torch.empty_like(x)
    rep = s.lin_v_heads // s.lin_k_heads
    for a in range(0, x.shape[0], s.block):
        xb = x[a:a + s.block]
        t = xb.shape[0]
        pad = -t % s.chunk
        q, k, v, z = F.pad(_norm(xb) @ w_in, (0, 0, 0, pad)).split([kd, kd, vd, vd], dim=-1)
        qh, kh = (F.normalize(a.reshape(-1, s.lin_k_heads, s.lin_dim), dim=-1)
                  .transpose(0, 1).repeat_interleave(rep, dim=0) for a in (q, k))
        vh = v.reshape(-1, s.lin_v_heads, s.lin_dim).transpose(0, 1)
        o, state = _linear_scan(qh, kh, vh, state, s.chunk)
        o = o.transpose(0, 1).reshape(-1, vd)[:t] * F.silu(z[:t])
        out[a:a + s.block] = xb + o @ w_out
    return out


def prefill(st: Stack, tokens: torch.Tensor, dense: bool,
            caches: list[tuple[torch.Tensor, torch.Tensor]] | None) -> torch.Tensor:
    """Logits of the last token after prefilling ``tokens`` (after ``caches`` if given)."""
    x = st.embed[tokens]
    a = 0
    for i in range(st.s.layers):
        if st.is_attention(i, dense):
            x = _attention(st, i, x, caches[a] if caches else None)
            a += 1
        else:
            x = _linear(st, i, x)
        x = _mlp(st, i, x)
    return _norm(x[-1:]) @ st.head


class DecodeState:
    """KV caches of the attention layers and states of the linear ones, for ``batch`` x ``ctx``."""

    def __init__(self, st: Stack, batch: int, ctx: int, dense: bool) -> None:
        s, dev, dt = st.s, st.device, st.dtype
        self.kv = {i: (torch.randn(batch, s.kv_heads, ctx, s.head_dim, device=dev, dtype=dt),
                       torch.randn(batch, s.kv_heads, ctx, s.head_dim, device=dev, dtype=dt))
                   for i in range(s.layers) if st.is_attention(i, dense)}
        self.lin = {i: torch.randn(batch, s.lin_v_heads, s.lin_dim, s.lin_dim, device=dev) * 1e-2
                    for i in range(s.layers) if not st.is_attention(i, dense)}
        self.tokens = torch.randint(0, s.vocab, (batch,), device=dev)
        self.dense = dense


def decode_step(st: Stack, ds: DecodeState) -> torch.Tensor:
    """One decode step of every sequence: its new token's K/V overwrite the last cache slot."""
    s = st.s
    x = st.embed[ds.tokens]
    b = x.shape[0]
    qd, kvd, rep = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.heads // s.kv_heads
    for i in range(s.layers):
        if i in ds.kv:
            w_in, w_out = st.attn[i]
            q, gate, k, v = (_norm(x) @ w_in).split([qd, qd, kvd, kvd], dim=-1)
            kc, vc = ds.kv[i]
            kc[:, :, -1] = k.view(b, s.kv_heads, s.head_dim)
            vc[:, :, -1] = v.view(b, s.kv_heads, s.head_dim)
            o = F.scaled_dot_product_attention(q.view(b, s.kv_heads, rep, s.head_dim), kc, vc)
            x = x + (o.reshape(b, qd) * torch.sigmoid(gate)) @ w_out
        else:
            w_in, w_out = st.lin[i]  # type: ignore[misc]
            kd, vd = s.lin_k_heads * s.lin_dim, s.lin_v_heads * s.lin_dim
            q, k, v, z = (_norm(x) @ w_in).split([kd, kd, vd, vd], dim=-1)
            lr = s.lin_v_heads // s.lin_k_heads
            qh, kh = (F.normalize(a.view(b, s.lin_k_heads, s.lin_dim), dim=-1)
                      .repeat_interleave(lr, dim=1).float() for a in (q, k))
            vh = v.view(b, s.lin_v_heads, s.lin_dim).float()
            state = ds.lin[i]
            state.add_(kh[..., :, None] * vh[..., None, :])
            o = (qh[..., None, :] @ state).squeeze(-2).to(x.dtype).reshape(b, vd)
            x = x + (o * F.silu(z)) @ w_out
        up, down = st.mlp[i]
        g, u = (_norm(x) @ up).chunk(2, dim=-1)
        x = x + (F.silu(g) * u) @ down
    return _norm(x) @ st.head
