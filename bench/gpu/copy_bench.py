"""KV copy bench: host<->GPU time of KV-shaped transfers, as LMCache moves a pool hit.

Geometry: a prefix of ``T`` tokens is ``ceil(T / chunk)`` chunks of ``chunk`` tokens
(LMCache-like: 256 and 1,568); each token holds ``bpt`` bytes (32 KiB: 16 attention
layers x 4 KV heads x 256 x K,V x FP8; 64 KiB: the same in bf16) over ``LAYERS`` = 16
layers. A host chunk is ``[LAYERS, 2, chunk, bpt / LAYERS / 2]`` bytes, contiguous.

Modes (direction ``h2d`` = pool load, ``d2h`` = pool store):
- ``whole``: one copy per chunk into a contiguous GPU buffer (the copy engine's limit).
- ``layerwise``: per chunk and layer, copy the layer's slice into a GPU staging buffer and
  scatter it into a paged KV cache (vLLM layout: per layer ``[2, slots, width]``, 16-token
  blocks placed by a random block permutation) with ``index_copy_``; ``d2h`` gathers with
  ``index_select`` then copies down. This is what a real load does, launch for launch.
Host memory: pinned (page-locked) or pageable. Overlap: with ``overlap`` the copies run
while a side stream multiplies 8192x8192 bf16 matrices (a prefill's work), enqueued
beforehand to cover the copy.

Correctness: copies run on their own stream, which first waits for the current stream
(so it cannot race work enqueued before it, the study's missing dependency) and which the
current stream waits for before reading. The destination is poisoned before every timed
repetition and every byte is compared with the source afterwards (``h2d``; for ``d2h``,
the first and last chunk). ``race_check`` drops each wait on purpose and counts corrupted
bytes, to show that the check can see a race. Times: CUDA events on the copy stream,
median of ``reps``; GB/s = bytes / time (1 GB = 1e9 B).
"""

from __future__ import annotations

import argparse
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from gpucommon import Results, environment, median, pick_device, sync

LAYERS = 16
BLOCK = 16  # paged-KV block size in tokens (vLLM's default)


class Buffers:
    """Host (pinned, pageable), GPU flat, GPU paged and reference buffers of ``max_bytes``."""

    def __init__(self, device: torch.device, max_tokens: int, max_bpt: int) -> None:
        self.device = device
        self.max_tokens = max_tokens
        nbytes = max_tokens * max_bpt
        gen = torch.Generator(device=device).manual_seed(18)
        self.ref = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=gen)
        pin = device.type == "cuda"
        self.host = {"pinned": torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin),
                     "pageable": torch.empty(nbytes, dtype=torch.uint8)}
        self.host["pinned"].copy_(self.ref.cpu() if not pin else self.ref)
        self.host["pageable"].copy_(self.host["pinned"])
        self.flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.paged = torch.empty(nbytes, dtype=torch.uint8, device=device)
        blocks = torch.randperm(max_tokens // BLOCK, device=device, generator=gen)
        self.slots = (blocks[:, None] * BLOCK + torch.arange(BLOCK, device=device)).reshape(-1)
        sync(device)

    def views(self, chunk: int, bpt: int, n_chunks: int, pin: str) -> dict[str, torch.Tensor]:
        width = bpt // LAYERS // 2
        total = n_chunks * chunk * bpt
        shape5 = (n_chunks, LAYERS, 2, chunk, width)
        return {"host": self.host[pin][:total].view(shape5),
                "ref": self.ref[:total].view(shape5),
                "flat": self.flat[:total].view(shape5),
                "paged": self.paged[: self.max_tokens * bpt].view(LAYERS, 2, -1, width),
                "slots": self.slots[: n_chunks * chunk]}


def enqueue_copies(v: dict[str, torch.Tensor], mode: str, direction: str,
                   staging: torch.Tensor) -> None:
    """The transfer itself, on the current stream."""
    host, chunk = v["host"], v["host"].shape[3]
    for c in range(host.shape[0]):
        if mode == "whole":
            if direction == "h2d":
                v["flat"][c].copy_(host[c], non_blocking=True)
            else:
                host[c].copy_(v["ref"][c], non_blocking=True)
            continue
        slots = v["slots"][c * chunk:(c + 1) * chunk]
        for layer in range(LAYERS):
            if direction == "h2d":
                staging.copy_(host[c, layer], non_blocking=True)
                v["paged"][layer].index_copy_(1, slots, staging)
            else:
                torch.index_select(v["paged"][layer], 1, slots, out=staging)
                host[c, layer].copy_(staging, non_blocking=True)


def mismatches(v: dict[str, torch.Tensor], mode: str, direction: str) -> torch.Tensor:
    """Bytes of the destination that differ from the source (a device scalar)."""
    ref = v["ref"]
    if direction == "d2h":
        ends = [0, ref.shape[0] - 1]
        return sum(((v["host"][i].to(ref.device) != ref[i]).sum() for i in ends),
                   torch.zeros((), dtype=torch.int64, device=ref.device))
    if mode == "whole":
        return (v["flat"] != ref).sum()
    n, _, _, chunk, width = ref.shape
    bad = torch.zeros((), dtype=torch.int64, device=ref.device)
    for layer in range(LAYERS):
        got = v["paged"][layer].index_select(1, v["slots"])
        want = ref[:, layer].permute(1, 0, 2, 3).reshape(2, n * chunk, width)
        bad += (got != want).sum()
    return bad


def poison(v: dict[str, torch.Tensor], mode: str, direction: str) -> None:
    if direction == "d2h":
        v["host"][0].fill_(0x5A)
        v["host"][-1].fill_(0x5A)
    elif mode == "whole":
        v["flat"].fill_(0x5A)
    else:
        v["paged"].fill_(0x5A)


class Streams:
    """Copy and compute side streams (absent on the CPU, where everything is serial)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.copy = torch.cuda.Stream() if self.cuda else None
        self.compute = torch.cuda.Stream() if self.cuda else None
        # -1: the highest priority; the scheduler hands free SMs to its kernels first
        self.copy_high = torch.cuda.Stream(priority=-1) if self.cuda else None

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream) if self.cuda else nullcontext()

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True) if self.cuda else None


def matmul_load(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Operands for the overlap's compute and the ms one product takes."""
    n = 8192 if device.type == "cuda" else 128
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return a, b, (time.perf_counter() - t0) * 100


def one_rep(v: dict[str, torch.Tensor], cfg: dict[str, Any], st: Streams,
            staging: torch.Tensor, load: tuple[torch.Tensor, torch.Tensor, float],
            est_ms: float) -> tuple[float, int, bool]:
    """One timed transfer: (ms, bad bytes, whether the compute outlived the copy)."""
    device = staging.device
    poison(v, cfg["mode"], cfg["direction"])
    sync(device)
    e0, e1, ec = st.event(), st.event(), st.event()
    if cfg["overlap"]:
        with st.on(st.compute):
            for _ in range(min(1000, math.ceil(1.5 * est_ms / max(load[2], 1e-3)) + 2)):
                load[0] @ load[1]
            if ec is not None:
                ec.record()
    t0 = time.perf_counter()
    copy = st.copy_high if cfg.get("priority") == "high" else st.copy
    with st.on(copy):
        if st.cuda:
            copy.wait_stream(torch.cuda.current_stream())  # type: ignore[union-attr]
            e0.record()
        enqueue_copies(v, cfg["mode"], cfg["direction"], staging)
        if st.cuda:
            e1.record()
    if st.cuda:
        torch.cuda.current_stream().wait_stream(copy)  # type: ignore[arg-type]
    bad = int(mismatches(v, cfg["mode"], cfg["direction"]).item())
    sync(device)
    if not st.cuda:
        return (time.perf_counter() - t0) * 1e3, bad, False
    ms = float(e0.elapsed_time(e1))
    covered = bool(cfg["overlap"]) and float(e0.elapsed_time(ec)) >= ms
    return ms, bad, covered


def measure(buf: Buffers, cfg: dict[str, Any], st: Streams, load: Any,
            reps: int) -> dict[str, Any]:
    chunk, bpt = cfg["chunk"], cfg["bpt"]
    n_chunks = math.ceil(cfg["tokens"] / chunk)
    v = buf.views(chunk, bpt, n_chunks, cfg["pin"])
    staging = torch.empty(2, chunk, bpt // LAYERS // 2, dtype=torch.uint8, device=buf.device)
    nbytes = n_chunks * chunk * bpt
    if cfg["direction"] == "d2h" and cfg["mode"] == "layerwise":  # the pages hold this prefix
        for c in range(n_chunks):
            for layer in range(LAYERS):
                v["paged"][layer].index_copy_(1, v["slots"][c * chunk:(c + 1) * chunk],
                                              v["ref"][c, layer])
    est_ms = nbytes / (20e9 if cfg["pin"] == "pinned" else 5e9) * 1e3
    runs = [one_rep(v, cfg, st, staging, load, est_ms) for _ in range(reps)]
    ms = median([r[0] for r in runs])
    return {**cfg, "tokens": n_chunks * chunk, "chunks": n_chunks, "bytes": nbytes,
            "ms_runs": [round(r[0], 4) for r in runs], "ms": round(ms, 4),
            "gbps": round(nbytes / ms / 1e6, 3), "bad_bytes": sum(r[1] for r in runs),
            "compute_covered_copy": all(r[2] for r in runs) if cfg["overlap"] else None}


def race_check(buf: Buffers, st: Streams, load: Any, tokens: int) -> dict[str, Any]:
    """Bad bytes with each stream dependency dropped, and with both kept."""
    if not st.cuda:
        return {"kind": "race", "skipped": "no streams on the cpu"}
    chunk, bpt = 1568, 32768
    v = buf.views(chunk, bpt, math.ceil(tokens / chunk), "pinned")
    staging = torch.empty(2, chunk, bpt // LAYERS // 2, dtype=torch.uint8, device=buf.device)
    out: dict[str, Any] = {"kind": "race", "tokens": v["slots"].numel(), "chunk": chunk,
                           "bpt": bpt, "mode": "layerwise", "pin": "pinned"}
    cur = torch.cuda.current_stream()
    for wait_before, wait_after, name in ((True, True, "both_waits"),
                                          (True, False, "no_wait_after_copy"),
                                          (False, True, "no_wait_before_copy")):
        v["paged"].fill_(0)
        sync(buf.device)
        for _ in range(40):  # the current stream is still busy when the copy is enqueued
            load[0] @ load[1]
        v["paged"].fill_(0x5A)  # e.g. the pages' previous user, enqueued before the load
        with st.on(st.copy):
            if wait_before:
                st.copy.wait_stream(cur)  # type: ignore[union-attr]
            enqueue_copies(v, "layerwise", "h2d", staging)
        if wait_after:
            cur.wait_stream(st.copy)  # type: ignore[arg-type]
        bad = mismatches(v, "layerwise", "h2d")
        sync(buf.device)
        out[name] = int(bad.item())
    return out


def configs(small: bool) -> list[dict[str, Any]]:
    """Pinned first (the pool's real path), then overlap, then pageable (1,568-token chunks)."""
    chunks, bpts = ((16, 48), (2048, 4096)) if small else ((256, 1568), (32768, 65536))
    sizes = (1, 256) if small else (1, 8192, 32768, 131072)
    rows = []
    for pin, overlaps, dirs in (("pinned", (False, True), ("h2d", "d2h")),
                                ("pageable", (False, True), ("h2d", "d2h"))):
        for overlap in overlaps:
            for direction in dirs:
                if overlap and direction == "d2h":
                    continue
                for mode in ("whole", "layerwise"):
                    for chunk in chunks if pin == "pinned" else chunks[1:]:
                        for bpt in bpts:
                            if pin == "pageable" and overlap and bpt != bpts[0]:
                                continue
                            for size in sizes:
                                rows.append({"kind": "copy", "direction": direction, "mode": mode,
                                             "pin": pin, "overlap": overlap, "chunk": chunk,
                                             "bpt": bpt, "tokens": max(size, chunk)})
    return rows


def followup(small: bool) -> list[dict[str, Any]]:
    """Second run: the 128k pinned loads again (spread), overlapped with the copy stream
    at normal and at high priority (does SM contention explain the overlapped scatter?)."""
    chunks, bpt, tokens = ((16, 48), 2048, 256) if small else ((256, 1568), 32768, 131072)
    rows = []
    for overlap, prio in ((False, "normal"), (True, "normal"), (True, "high")):
        for mode in ("whole", "layerwise"):
            for chunk in chunks:
                rows.append({"kind": "copy", "direction": "h2d", "mode": mode, "pin": "pinned",
                             "overlap": overlap, "priority": prio, "chunk": chunk, "bpt": bpt,
                             "tokens": tokens})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--small", action="store_true", help="tiny sizes, for a CPU smoke run")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip what starts later")
    ap.add_argument("--set", choices=("main", "followup"), default="main")
    args = ap.parse_args()
    t_start = time.perf_counter()
    device = pick_device(args.cpu)
    rows = configs(args.small) if args.set == "main" else followup(args.small)
    max_tokens = max(math.ceil(r["tokens"] / r["chunk"]) * r["chunk"] for r in rows)
    max_tokens = math.ceil(max_tokens / BLOCK) * BLOCK
    buf = Buffers(device, max_tokens, max(r["bpt"] for r in rows))
    st = Streams(device)
    load = matmul_load(device)
    res = Results(args.out, {"bench": "copy", "env": environment(device), "layers": LAYERS,
                             "block": BLOCK, "matmul_ms": round(load[2], 4),
                             "setup_s": round(time.perf_counter() - t_start, 2)})
    res.add(race_check(buf, st, load, 256 if args.small else 32768))
    skipped = 0
    for i, cfg in enumerate(rows):
        if time.perf_counter() - t_start > args.budget_s:
            skipped = len(rows) - i
            break
        reps = 3 if cfg["pin"] == "pinned" or cfg["tokens"] < 100_000 else 2
        if cfg["tokens"] == cfg["chunk"] or i == 0 or args.set == "followup":  # warm-up, untimed
            measure(buf, cfg, st, load, 1)
        res.add(measure(buf, cfg, st, load, reps))
    res.finish(skipped_configs=skipped, wall_s=round(time.perf_counter() - t_start, 1))


if __name__ == "__main__":
    main()
