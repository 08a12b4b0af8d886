"""Prefill and decode times of the 27B-shaped stack (stack_model.py), written as JSON.

Jobs, in order (a job that would run past ``--budget-s`` by its predicted time, the last
time of its series scaled by the square of the token ratio, is skipped and listed):
1. ceilings: a bf16 8192^3 matrix product (TFLOP/s) and a 4 GiB device copy (GB/s,
   bytes read plus written), the two rates every other number is read against;
2. hybrid cold prefill at 1k..128k tokens; 3. hybrid prefill of new tokens after a cached
prefix (32k and 128k cached, 1,568 and 8,192 new); 4. decode step time at batch x context;
5. dense cold prefill 1k..64k; 6. hybrid cold 256k (held out of the fit, last because it
is the longest). Prefill: CUDA events around the whole forward pass (embedding to the
last token's logits), after one untimed warm-up at 1k; median of 3 runs up to 8k tokens,
2 up to 64k, 1 beyond. Decode: a CUDA graph of one step (as vLLM captures decode),
replayed 20 times after 3 warm-ups, and the same step run eagerly for comparison.
FLOPs are counted analytically: 2 x non-embedding parameters per token, plus causal
attention ``4 x heads x head_dim x (nc + n^2/2)`` per attention layer.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from gpucommon import Results, Timer, environment, median, pick_device, sync
from stack_model import FULL, SMALL, DecodeState, Stack, decode_step, prefill, sdpa_context

K = 1024


def ceilings(device: torch.device) -> dict[str, float]:
    n = 8192 if device.type == "cuda" else 256
    dt = torch.bfloat16
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    src = torch.randn(1 << (29 if device.type == "cuda" else 20), device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        a @ b
        dst.copy_(src)
    t = Timer(device)
    t.start()
    for _ in range(10):
        a @ b
    t.stop()
    mm = t.ms() / 10
    t.start()
    for _ in range(10):
        dst.copy_(src)
    t.stop()
    cp = t.ms() / 10
    return {"matmul_tflops": round(2 * n ** 3 / mm / 1e9, 1),
            "d2d_gbps": round(2 * src.numel() * 4 / cp / 1e6, 1)}


def attn_flops(st: Stack, dense: bool, cached: int, new: int) -> float:
    layers = sum(st.is_attention(i, dense) for i in range(st.s.layers))
    return layers * 4.0 * st.s.heads * st.s.head_dim * (new * cached + new * new / 2)


def run_prefill(st: Stack, dense: bool, cached: int, new: int, reps: int,
                caches: list[tuple[torch.Tensor, torch.Tensor]] | None) -> dict[str, Any]:
    dev = st.device
    tokens = torch.randint(0, st.s.vocab, (new,), device=dev)
    use = [(k[:cached], v[:cached]) for k, v in caches] if cached and caches else None
    runs = []
    for _ in range(reps):
        t = Timer(dev)
        t.start()
        with torch.no_grad(), sdpa_context(dev):
            prefill(st, tokens, dense, use)
        t.stop()
        runs.append(t.ms())
    lin = 2.0 * (st.params(dense) - st.embed.numel() - st.head.numel()) * new
    flops = lin + attn_flops(st, dense, cached, new) + 2.0 * st.s.hidden * st.s.vocab
    ms = median(runs)
    return {"kind": "prefill", "stack": "dense" if dense else "hybrid", "cached": cached,
            "new": new, "ms_runs": [round(r, 3) for r in runs], "ms": round(ms, 3),
            "tflop": round(flops / 1e12, 3), "tflops": round(flops / ms / 1e9, 1)}


def run_decode(st: Stack, batch: int, ctx: int, steps: int) -> dict[str, Any]:
    dev = st.device
    ds = DecodeState(st, batch, ctx, dense=False)
    row: dict[str, Any] = {"kind": "decode", "stack": "hybrid", "batch": batch, "context": ctx}
    with torch.no_grad(), sdpa_context(dev):
        for _ in range(3):
            decode_step(st, ds)
        t = Timer(dev)
        t.start()
        for _ in range(5):
            decode_step(st, ds)
        t.stop()
        row["eager_ms"] = round(t.ms() / 5, 4)
        if dev.type == "cuda":
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    decode_step(st, ds)
                for _ in range(3):
                    graph.replay()
                t.start()
                for _ in range(steps):
                    graph.replay()
                t.stop()
                row["graph_ms"] = round(t.ms() / steps, 4)
                del graph
            except RuntimeError as exc:  # capture can fail; the eager time stands
                row["graph_error"] = str(exc)[:300]
    row["ms"] = row.get("graph_ms", row["eager_ms"])
    del ds
    return row


def run_chunked(st: Stack, total: int, chunk: int,
                caches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """A cold prefill of ``total`` tokens in ``chunk``-token steps, as chunked prefill runs
    it: each step attends to the KV of the steps before it (random stand-ins here)."""
    dev = st.device
    tokens = torch.randint(0, st.s.vocab, (total,), device=dev)
    t = Timer(dev)
    t.start()
    with torch.no_grad(), sdpa_context(dev):
        for a in range(0, total, chunk):
            use = [(k[:a], v[:a]) for k, v in caches] if a else None
            prefill(st, tokens[a:a + chunk], False, use)
    t.stop()
    return {"kind": "chunked_prefill", "stack": "hybrid", "cached": 0, "new": total,
            "chunk": chunk, "ms": round(t.ms(), 3)}


def followup_plan(small: bool) -> list[dict[str, Any]]:
    """Second run: a short question after a 128k cached prefix (the study's pool hit asks
    64 tokens), cold 32k and 128k again (spread), and 128k as chunked prefill."""
    u = 16 if small else K
    jobs: list[dict[str, Any]] = [{"job": "prefill", "dense": False, "cached": 128 * u, "new": n}
                                  for n in (64, 512, 1568)]
    jobs += [{"job": "prefill", "dense": False, "cached": 0, "new": n * u} for n in (32, 128)]
    jobs += [{"job": "chunked", "new": 128 * u, "chunk": c * u} for c in (8, 16)]
    return jobs


def plan(small: bool) -> list[dict[str, Any]]:
    u = 16 if small else K
    cold = [1, 2, 4, 8, 16, 32, 64, 128] if not small else [4, 8, 16, 32]
    jobs: list[dict[str, Any]] = [{"job": "prefill", "dense": False, "cached": 0, "new": c * u}
                                  for c in cold]
    for cached in ((32, 128) if not small else (16, 32)):
        for new in ((1568, 8192) if not small else (24, 64)):
            jobs.append({"job": "prefill", "dense": False, "cached": cached * u, "new": new})
    dec = ([(1, 4), (1, 32), (1, 128), (8, 4), (8, 32), (32, 4), (32, 16), (64, 4)]
           if not small else [(1, 4), (4, 8)])
    jobs += [{"job": "decode", "batch": b, "context": c * u} for b, c in dec]
    jobs += [{"job": "prefill", "dense": True, "cached": 0, "new": c * u}
             for c in ([1, 2, 4, 8, 16, 32, 64] if not small else [4, 8, 16])]
    jobs.append({"job": "prefill", "dense": False, "cached": 0, "new": (256 if not small else 64) * u,
                 "held_out": True})
    return jobs


def predicted_s(done: list[dict[str, Any]], job: dict[str, Any]) -> float:
    """The last prefill of the same stack, scaled by the squared token ratio."""
    same = [r for r in done if r.get("kind") == "prefill" and r["stack"] ==
            ("dense" if job["dense"] else "hybrid") and r["cached"] == 0]
    if not same:
        return 0.0
    last = same[-1]
    return last["ms"] / 1e3 * (job["new"] / last["new"]) ** 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--small", action="store_true", help="tiny shapes, for a CPU smoke run")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--set", choices=("main", "followup"), default="main")
    args = ap.parse_args()
    t0 = time.perf_counter()
    dev = pick_device(args.cpu)
    torch.manual_seed(18)
    meta: dict[str, Any] = {"bench": "stack", "env": environment(dev), **ceilings(dev)}
    st = Stack(SMALL if args.small else FULL, dev, torch.bfloat16)
    meta.update(shape=st.s.__dict__, params_hybrid=st.params(False), params_dense=st.params(True))
    jobs = plan(args.small) if args.set == "main" else followup_plan(args.small)
    max_cached = max([j.get("cached", 0) for j in plan(args.small)]
                     + [j["new"] for j in jobs if j["job"] == "chunked"])
    kvd = st.s.kv_heads * st.s.head_dim
    caches = [(torch.randn(max_cached, kvd, device=dev, dtype=st.dtype),
               torch.randn(max_cached, kvd, device=dev, dtype=st.dtype))
              for i in range(st.s.layers) if st.is_attention(i, False)]
    run_prefill(st, False, 0, plan(args.small)[0]["new"], 1, None)  # warm-up, untimed
    run_prefill(st, False, max_cached, 64, 1, caches)
    sync(dev)
    meta["setup_s"] = round(time.perf_counter() - t0, 1)
    res = Results(args.out, meta)
    skipped = []
    for job in jobs:
        left = args.budget_s - (time.perf_counter() - t0)
        if job["job"] == "prefill" and job["cached"] == 0:
            reps = 3 if job["new"] <= 8 * K else 2 if job["new"] <= 64 * K else 1
            if predicted_s(res.doc["results"], job) * reps > left:
                skipped.append(job)
                continue
        elif left < 15:
            skipped.append(job)
            continue
        else:
            reps = 2
        try:
            if job["job"] == "chunked":
                row = run_chunked(st, job["new"], job["chunk"], caches)
            elif job["job"] == "decode":
                row = run_decode(st, job["batch"], job["context"], 20)
            else:
                row = run_prefill(st, job["dense"], job["cached"], job["new"], reps, caches)
                row["held_out"] = job.get("held_out", False)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
            row = {**job, "error": str(exc)[:300]}
        if dev.type == "cuda":
            row["max_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 1)
            torch.cuda.empty_cache()
        res.add(row)
    res.finish(skipped=skipped, wall_s=round(time.perf_counter() - t0, 1))


if __name__ == "__main__":
    main()
