"""Fit the ``h200-27b`` replica profile to the bench/gpu results (CPU; no GPU needed).

Same model and steps as ``study-27b`` (docs/model.md), from measurements instead of the
study's medians (docs/calibration.md has the numbers and the residuals):

1. Cold prefill -> ``a``, ``b`` and the GPU's own fixed cost ``f_gpu``: least squares of
   ``f_gpu + a n + b n^2`` on the hybrid stack's cold runs up to 128k, each row divided by
   its measured time (relative error, so 1k counts as much as 128k). The 256k run is held
   out and predicted. ``prefill_fixed_s`` = the study's 0.25 s (the front end's
   tokenization and scheduling of a long prompt, which a bare stack does not have) +
   ``f_gpu``. The cached-prefix runs are predicted, not fitted: they test the quadratic
   term's split ``(c + n)^2 - c^2``.
2. Pool load -> ``load_fixed_s``, ``load_bytes_per_s``: a straight line through the
   layer-wise scatter loads (pinned, 1,568-token chunks, 32 KiB/token: what LMCache does
   for the study's geometry), ``L0 + bytes / BW``, by the same relative least squares.
3. Decode -> ``tpot_s``, ``tpot_context_s`` as the study did, from physics, with the
   physics measured: ``d1`` = 32 KiB (FP8 KV) / the measured device-copy bandwidth;
   ``d0`` = the batch-1 4k CUDA-graph step less its context part. The residuals are shown
   against the measured steps (bf16 KV, so there ``2 d1``); the form has no per-sequence
   term, and PyTorch's fused kernel spreads one sequence's long KV over too few blocks, so
   batch 1 at 32k-128k sits far above it (a kernel limit, not the hardware's).
4. Store -> ``store_bytes_per_s``: the layer-wise gather + copy down (pinned, 1,568, 32 KiB)
   at 128k, bytes over time.
Capacities and geometry (chunk, bytes per token, 64 GiB of GPU KV, 256 GiB pool) are the
study's deployment's, unchanged: the stack's bf16 weights are 53.7 GB, as assumed there.

Usage: ``python bench/gpu/fit_profile.py [--results DIR] [--write PATH]`` prints the fit
and residuals as Markdown; ``--write`` also writes the TOML profile.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
PROFILE = HERE.parents[1] / "sim" / "replica" / "profiles" / "h200-27b.toml"
STUDY_F = 0.25  # docs/model.md step 4: the front end's share of every prefill
STUDY = {"chunk_tokens": 1568, "bytes_per_token": 32768, "gpu_kv_bytes": 64 << 30,
         "pool_bytes": 256 << 30}


def rel_lstsq(cols: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Coefficients minimising the sum of squared relative errors."""
    x = np.stack(cols, axis=1) / y[:, None]
    coef, *_ = np.linalg.lstsq(x, np.ones_like(y), rcond=None)
    return coef


def load(results: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Rows of the main run, then the follow-up's (marked ``followup``), and the main meta."""
    doc = json.loads((results / "stack.json").read_text())
    stack, copy = doc["results"], json.loads((results / "copy.json").read_text())["results"]
    for name, rows in (("stack_followup.json", stack), ("copy_followup.json", copy)):
        if (results / name).exists():
            rows += [{**r, "followup": True, "held_out": True}
                     for r in json.loads((results / name).read_text())["results"]]
    return stack, copy, doc["meta"]


def fit_decode(stack: list[dict[str, Any]], meta: dict[str, Any], out: list[str]
               ) -> tuple[float, float]:
    """Step 3: ``(d0, d1)`` from the measured ceilings; residuals appended to ``out``."""
    dec = [r for r in stack if r.get("kind") == "decode" and "ms" in r]
    hbm = meta["d2d_gbps"] * 1e9
    d1 = STUDY["bytes_per_token"] / hbm
    first = min(dec, key=lambda r: (r["batch"], r["context"]))
    d0 = first["ms"] / 1e3 - 2 * d1 * first["context"]
    out += ["", "### Decode step (CUDA graph): `d0 + d1 K`, K = batch x context", "",
            f"HBM {hbm / 1e12:.2f} TB/s (device copy); d1 = 32 KiB / HBM = {d1 * 1e9:.2f} "
            f"ns/token (FP8 KV; bf16, as measured: {2 * d1 * 1e9:.2f}); "
            f"d0 = {d0 * 1e3:.2f} ms", "",
            "| batch | context | measured ms | model ms (bf16 KV) | error |", "|---|---|---|---|---|"]
    for r in dec:
        pred = d0 + 2 * d1 * r["batch"] * r["context"]
        out.append(f"| {r['batch']} | {r['context']} | {r['ms']:.2f} | {pred * 1e3:.2f} | "
                   f"{100 * (pred / (r['ms'] / 1e3) - 1):+.1f} % |")
    return float(d0), float(d1)


def fit(stack: list[dict[str, Any]], copy: list[dict[str, Any]], meta: dict[str, Any]
        ) -> tuple[dict[str, Any], list[str]]:
    out: list[str] = []
    cold = [r for r in stack if r.get("kind") == "prefill" and r["stack"] == "hybrid"
            and r["cached"] == 0 and "ms" in r and not r.get("followup")]
    fitted = [r for r in cold if not r["held_out"]]
    n = np.array([r["new"] for r in fitted], float)
    y = np.array([r["ms"] / 1e3 for r in fitted])
    f_gpu, a, b = rel_lstsq([np.ones_like(n), n, n * n], y)
    out += ["### Prefill (hybrid stack): `f_gpu + a n + b ((c+n)^2 - c^2)`", "",
            f"f_gpu = {f_gpu:.4f} s, a = {a:.4e} s/token, b = {b:.4e} s/token^2", "",
            "| cached | new | measured s | fit s | error | |", "|---|---|---|---|---|---|"]
    for r in [r for r in stack if r.get("kind") == "prefill" and r["stack"] == "hybrid"
              and "ms" in r]:
        c, m = r["cached"], r["new"]
        pred = f_gpu + a * m + b * ((c + m) ** 2 - c * c)
        role = ("second run" if r.get("followup") else "held out" if r["held_out"]
                else "predicted" if c else "fitted")
        out.append(f"| {c} | {m} | {r['ms'] / 1e3:.3f} | {pred:.3f} | "
                   f"{100 * (pred / (r['ms'] / 1e3) - 1):+.1f} % | {role} |")

    lw = [r for r in copy if r.get("kind") == "copy" and r["direction"] == "h2d"
          and r["mode"] == "layerwise" and r["pin"] == "pinned" and not r["overlap"]
          and r["chunk"] == 1568 and r["bpt"] == 32768 and not r.get("followup")]
    nb = np.array([r["bytes"] for r in lw], float)
    t = np.array([r["ms"] / 1e3 for r in lw])
    l0, inv_bw = rel_lstsq([np.ones_like(nb), nb], t)
    out += ["", "### Pool load (layer-wise scatter, pinned, 1,568-token chunks, 32 KiB/token)",
            "", f"L0 = {l0 * 1e3:.3f} ms, BW = {1 / inv_bw / 1e9:.2f} GB/s", "",
            "| tokens | measured ms | fit ms | error |", "|---|---|---|---|"]
    for r in lw:
        pred = l0 + r["bytes"] * inv_bw
        out.append(f"| {r['tokens']} | {r['ms']:.2f} | {pred * 1e3:.2f} | "
                   f"{100 * (pred / (r['ms'] / 1e3) - 1):+.1f} % |")

    d0, d1 = fit_decode(stack, meta, out)

    store = max((r for r in copy if r.get("kind") == "copy" and r["direction"] == "d2h"
                 and r["mode"] == "layerwise" and r["pin"] == "pinned" and r["chunk"] == 1568
                 and r["bpt"] == 32768 and not r.get("followup")), key=lambda r: r["tokens"])
    store_bw = store["bytes"] / (store["ms"] / 1e3)
    out += ["", f"Store: {store['tokens']} tokens in {store['ms']:.1f} ms = "
            f"{store_bw / 1e9:.2f} GB/s"]
    prof = {"name": "h200-27b", **STUDY,
            "prefill_fixed_s": round(STUDY_F + max(0.0, float(f_gpu)), 4),
            "prefill_token_s": float(f"{a:.4e}"), "prefill_token2_s": float(f"{b:.4e}"),
            "load_fixed_s": round(max(0.0, float(l0)), 5),
            "load_bytes_per_s": float(f"{1 / inv_bw:.4e}"),
            "store_bytes_per_s": float(f"{store_bw:.4e}"),
            "tpot_s": round(float(d0), 5), "tpot_context_s": float(f"{d1:.4e}")}
    return prof, out


def spread(stack: list[dict[str, Any]], copy: list[dict[str, Any]]) -> list[str]:
    """The follow-up run's repeats beside the first run's, and its overlap variants."""
    out = ["", "### Second run (follow-up) against the first", "",
           "| what | first | second |", "|---|---|---|"]
    key = ("direction", "mode", "pin", "overlap", "chunk", "bpt", "tokens")
    for r in (r for r in copy if r.get("followup") and r.get("kind") == "copy"):
        twin = [m for m in copy if not m.get("followup") and m.get("kind") == "copy"
                and all(m[k] == r[k] for k in key)]
        first = f"{twin[0]['ms']:.1f} ms" if twin else "-"
        label = (f"{r['mode']} h2d chunk {r['chunk']} {'overlap' if r['overlap'] else 'alone'}"
                 f" {r.get('priority', 'normal')} priority")
        out.append(f"| {label} | {first} | {r['ms']:.1f} ms ({r['gbps']:.1f} GB/s) |")
    for r in (r for r in stack if r.get("followup") and r.get("kind") != "prefill"):
        out.append(f"| cold {r['new']} as chunked prefill, {r['chunk']}-token steps | - | "
                   f"{r['ms'] / 1e3:.2f} s |")
    return out


HEADER = """\
# h200-27b: the study's deployment (27B hybrid, FP8 KV at 32 KiB/token, LMCache chunks of
# 1,568 tokens, 256 GiB pool, 64 GiB of GPU KV) with timings measured on one NVIDIA H200.
#
# Built by bench/gpu/fit_profile.py from bench/gpu/results/*.json (bench/gpu/run_all.sh on
# the device machine); fit, residuals and caveats in docs/calibration.md. Prefill: a
# 27B-shaped hybrid stack, random bf16 weights, PyTorch fused attention, plus the study's
# 0.25 s front-end share. Load/store: layer-wise scatter/gather into a paged KV cache over
# pinned memory, no LMCache software overhead (a hardware floor, not a deployment). Decode:
# the measured batch-1 CUDA-graph step; per token of context, 32 KiB over measured HBM.
"""


def to_toml(prof: dict[str, Any]) -> str:
    lines = [HEADER]
    for key, value in prof.items():
        lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value!r}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--write", type=Path, nargs="?", const=PROFILE, default=None)
    args = ap.parse_args()
    prof, lines = fit(*load(args.results))
    lines += spread(*load(args.results)[:2])
    print("\n".join(lines))
    print("\n```toml\n" + to_toml(prof) + "```")
    if args.write:
        args.write.write_text(to_toml(prof), encoding="utf-8")


if __name__ == "__main__":
    main()
