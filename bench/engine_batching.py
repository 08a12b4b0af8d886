"""Does the engine batch queued prompts? Time to first token of k requests sent at once.

One real vLLM replica of the engine suite (``tests/e2e/vllm_servers.py``: the tiny local
Llama on the CPU, prefix caching, its threads on core 0) is started, a shared prefix is
warmed, then for each ``k`` in ``--hits`` ``k`` requests reading that prefix (a short
distinct suffix each) are sent at once, ``--reps`` times; then ``k`` in ``--misses``
requests with nothing cached. Each request is streamed with ``max_tokens`` 2 and its time
to the first body bytes is recorded, sorted per burst. Last, for each ``d`` in
``--decoding``, ``d`` requests with long replies (``--decode-tokens``) are started and,
once they decode, one hit is sent alone: its time to first token with ``d`` sequences
decoding on the engine (vLLM runs a new prompt's prefill in the same steps as the
running sequences' decodes). With ``--alone``, first: for each length in words, a prompt
nothing is cached for sent alone (``max_tokens`` 1, not streamed, so the engine's count
of its tokens comes back): the engine's prefill time against prompt length, which sets
the load a workload of long prompts can be offered on this host at all.

An engine that computes one prompt at a time answers a burst of ``k`` at 1x, 2x, ... kx
one request's time; one that packs the prompts waiting when a step starts into that
step (vLLM's scheduler with chunked prefill) answers the first alone and most of the
rest together, about one step later. The gap between the two is what
``policies.calibration``'s queued fixed factor learns, and what the simulator's
``queued_fixed_share`` (the gauntlet's ``batched`` row) models.

    .venv/bin/python bench/engine_batching.py [--hits 1,2,4,8] [--misses 1,2,4]
        [--reps 3] [--alone 100,400,1000,1500] [--json out.json]

Needs the vLLM CPU venv (``make vllm-venv``; ``LMROUTE_VLLM_PYTHON`` overrides it).
Not part of CI; about 4 minutes (1 of them vLLM starting).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
from vllm_servers import MODEL_NAME, REPO, VllmServer, cpu_features, make_model, vllm_python

PORT = 18431


def words(n: int, seed: int) -> str:
    """``n`` random numbers as text: a prompt no other seed shares a prefix with."""
    rng = random.Random(seed)
    return " ".join(str(rng.randrange(10_000)) for _ in range(n))


async def ttft(client: httpx.AsyncClient, url: str, prompt: str) -> float:
    started = time.perf_counter()
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        reply.raise_for_status()
        async for _ in reply.aiter_bytes():
            break
    return time.perf_counter() - started


async def bursts(url: str, args: argparse.Namespace) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    async with httpx.AsyncClient(timeout=120) as client:
        for n in args.alone:
            for rep in range(args.reps):
                out.append(await _alone(client, url, n, rep))
        prefix = words(args.prefix_words, 1)
        for i in range(3):  # the prefix cached, the engine warm
            await ttft(client, url, f"{prefix} {words(args.suffix_words, 100 + i)}")
        plan = [("hits", k) for k in args.hits] + [("misses", k) for k in args.misses]
        for kind, k in plan:
            for rep in range(args.reps):
                seeds = [10_000 * k + 100 * rep + j + (5_000_000 if kind == "misses" else 0)
                         for j in range(k)]
                prompts = ([f"{prefix} {words(args.suffix_words, s)}" for s in seeds]
                           if kind == "hits" else
                           [words(args.prefix_words + args.suffix_words, s) for s in seeds])
                times = sorted(await asyncio.gather(*(ttft(client, url, p) for p in prompts)))
                out.append({"kind": kind, "k": k, "rep": rep, "ttft_ms": [t * 1e3 for t in times]})
                print(f"{kind:6} k={k} rep={rep}: " + " ".join(f"{t * 1e3:.0f}" for t in times),
                      flush=True)
        for d in args.decoding:
            for rep in range(args.reps):
                out.append(await _behind_decodes(client, url, prefix, d, rep, args))
    return out


async def _alone(client: httpx.AsyncClient, url: str, n: int, rep: int) -> dict[str, object]:
    """One prompt of ``n`` words, nothing of it cached, sent alone: its prefill time."""
    body = {"model": MODEL_NAME, "prompt": words(n, 3_000_000 + 100 * n + rep), "max_tokens": 1}
    started = time.perf_counter()
    reply = await client.post(f"{url}/v1/completions", json=body)
    reply.raise_for_status()
    took = time.perf_counter() - started
    tokens = int(reply.json()["usage"]["prompt_tokens"])
    print(f"alone {tokens} tokens rep={rep}: {took * 1e3:.0f}", flush=True)
    return {"kind": "alone", "k": 1, "rep": rep, "tokens": tokens, "ttft_ms": [took * 1e3]}


async def _behind_decodes(client: httpx.AsyncClient, url: str, prefix: str, d: int, rep: int,
                          args: argparse.Namespace) -> dict[str, object]:
    """One hit's time to first token while ``d`` sequences decode on the engine."""
    prompts = [f"{prefix} {words(8, 7_000_000 + 100 * d + 10 * rep + j)}" for j in range(d)]
    decoders = [asyncio.create_task(_decode(client, url, p, args.decode_tokens))
                for p in prompts]
    await asyncio.sleep(0.5 if d else 0.0)  # their prefills done: they decode
    t = await ttft(client, url, f"{prefix} {words(args.suffix_words, 9_000_000 + 100 * d + rep)}")
    await asyncio.gather(*decoders)
    print(f"hit behind {d} decoding, rep={rep}: {t * 1e3:.0f}", flush=True)
    return {"kind": "hit_while_decoding", "k": d, "rep": rep, "ttft_ms": [t * 1e3]}


async def _decode(client: httpx.AsyncClient, url: str, prompt: str, tokens: int) -> None:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": tokens,
            "ignore_eos": True, "stream": True}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        reply.raise_for_status()
        async for _ in reply.aiter_bytes():
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hits", default="1,2,4,8", help="burst sizes of cached-prefix prompts")
    ap.add_argument("--misses", default="1,2,4", help="burst sizes of uncached prompts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prefix-words", type=int, default=700,
                    help="shared prefix length in words (numbers: about 1,500 tokens)")
    ap.add_argument("--suffix-words", type=int, default=50)
    ap.add_argument("--decoding", default="0,1,2,4,8",
                    help="sequences decoding while one hit is sent (empty: skip)")
    ap.add_argument("--decode-tokens", type=int, default=160,
                    help="reply length of the decoding sequences")
    ap.add_argument("--alone", default="",
                    help="prompt lengths in words, each sent alone with nothing cached")
    ap.add_argument("--json", type=Path, help="write every burst's TTFTs here")
    args = ap.parse_args()
    args.hits = [int(x) for x in args.hits.split(",") if x]
    args.misses = [int(x) for x in args.misses.split(",") if x]
    args.decoding = [int(x) for x in args.decoding.split(",") if x]
    args.alone = [int(x) for x in args.alone.split(",") if x]
    python = vllm_python()
    model = make_model(python, REPO / ".cache" / "e2e-model")
    server = VllmServer(python, model, PORT, f"tcp://*:{PORT + 1}", f"tcp://*:{PORT + 2}",
                        cpu=0).launch()
    try:
        server.wait_ready()
        results = asyncio.run(bursts(server.url, args))
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps({"engine": "vLLM (CPU), tiny Llama, core 0",
                                         "cpu": cpu_features(), "bursts": results}, indent=1))


if __name__ == "__main__":
    main()
