"""Precise (engine events) vs approximate (router bookkeeping) on real vLLM (CPU).

    .venv/bin/python tests/e2e/measure_events.py [--out out/events.json]   (make events-report)

Two vLLM replicas with a deliberately small prefix cache (``--num-gpu-blocks-override``
400 blocks of 32 tokens = 12,800 tokens, about four of the documents below), so the
engines evict. A corpus of ``docs`` documents (~2,600 tokens each) is read by two kinds of
traffic, interleaved in one seeded order:
- routed: ``sessions`` multi-turn chats through the router under test (``prefix_affinity``);
  each turn gets a new session id, so only the index can send it to its prefix;
- peer: the same documents sent straight to a replica chosen by hashing the document, as a
  second router with its own index (or a batch job) would. The router under test sees none
  of it, except through the engines' KV events.
The same workload runs twice on the same engines (prefix caches reset in between): once
with a router in precise mode (``--kv-events``) and once in approximate mode (its own
records on completion, LRU capacity set to the engines' real 12,800 tokens).

Per routed request, just before sending it the index is asked (``/index/lookup``) what it
believes each replica holds, and the engine reports what it actually reused
(``usage.prompt_tokens_details.cached_tokens``, ``--enable-prompt-tokens-details``).
Reported: index exactness (believed blocks on the chosen replica == engine-reused tokens
// 256), false hits (believed more than was there), missed hits (less), engine hit rate of
routed traffic (reused / prompt tokens) and mean TTFT.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from servers import router  # noqa: E402
from servers_redis import free_port  # noqa: E402
from vllm_servers import MODEL_NAME, REPO, VllmServer, make_model, vllm_python  # noqa: E402

BLOCK = 256


def document(i: int, words: int = 650) -> str:
    return " ".join(f"doc{i}w{j} kaloe mine" for j in range(words))


def turn_body(doc: str, turn: int) -> dict[str, Any]:
    msgs: list[dict[str, str]] = [{"role": "system", "content": doc}]
    for k in range(turn):
        msgs += [{"role": "user", "content": f"question {k} about it"},
                 {"role": "assistant", "content": f"answer {k}"}]
    msgs.append({"role": "user", "content": f"question {turn} about it"})
    return {"model": MODEL_NAME, "messages": msgs, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}


def send(url: str, body: dict[str, Any], session: str) -> tuple[float, dict[str, Any], str]:
    """(TTFT, final usage, serving replica) of one streamed chat request."""
    t0 = time.perf_counter()
    ttft, usage = None, {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120,
                      headers={"x-session-id": session}) as resp:
        resp.raise_for_status()
        served = resp.headers.get("x-lmroute-replica", url)
        for line in resp.iter_lines():
            if ttft is None:
                ttft = time.perf_counter() - t0
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    return ttft or 0.0, usage, served


def schedule(docs: int, sessions: int, turns: int, peers: int, seed: int) -> list[tuple[str, int, int]]:
    """Seeded interleaving of ("routed", session, turn) and ("peer", doc, 0) steps."""
    rng = random.Random(seed)
    pending = {s: 0 for s in range(sessions)}
    steps: list[tuple[str, int, int]] = []
    peer_left = peers
    while pending or peer_left:
        if peer_left and (not pending or rng.random() < peers / (peers + sessions * turns)):
            steps.append(("peer", rng.randrange(docs), 0))
            peer_left -= 1
            continue
        s = rng.choice(sorted(pending))
        steps.append(("routed", s, pending[s]))
        pending[s] += 1
        if pending[s] == turns:
            del pending[s]
    return steps


def run(engines: list[VllmServer], model: Path, precise: bool, args: argparse.Namespace
        ) -> dict[str, Any]:
    for e in engines:  # same start for both modes
        httpx.post(e.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    urls = [e.url for e in engines]
    extra = ["--policy", "prefix_affinity", "--tokenizer", str(model), "--pool-bytes", "0",
             "--kv-bytes-per-token", "1", "--gpu-kv-bytes", str(400 * 32)]
    if precise:
        extra += ["--kv-events", ",".join(e.events.replace("*", "127.0.0.1") for e in engines)]
    lm = router(urls, *extra, "--expose-replica-header").start(timeout_s=60)
    docs = [document(i) for i in range(args.docs)]
    rows: list[dict[str, Any]] = []
    try:
        for kind, a, turn in schedule(args.docs, args.sessions, args.turns, args.peers, args.seed):
            if kind == "peer":
                body = turn_body(docs[a], 0)
                send(urls[zlib.crc32(docs[a].encode()) % len(urls)], body, "peer")
                continue
            body = turn_body(docs[a % args.docs], turn)
            believed = httpx.post(lm.url + "/index/lookup", json=body).json()
            ttft, usage, served = send(lm.url, body, f"s{a}-t{turn}")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            rows.append({"believed": believed["gpu"].get(served, 0), "actual": cached // BLOCK,
                         "chain": believed["chain_blocks"], "cached": cached,
                         "prompt": usage.get("prompt_tokens", 0), "ttft": ttft})
            time.sleep(0.05)  # let a precise router's events land, as they would between turns
        modes = httpx.get(lm.url + "/replicas").json()
    finally:
        lm.stop()
    n = len(rows)
    return {
        "mode": "precise" if precise else "approximate",
        "replica_modes": [r["index"]["mode"] for r in modes["replicas"]],
        "routed_requests": n,
        "index_exact": round(sum(r["believed"] == r["actual"] for r in rows) / n, 3),
        "false_hits": round(sum(r["believed"] > r["actual"] for r in rows) / n, 3),
        "missed_hits": round(sum(r["believed"] < r["actual"] for r in rows) / n, 3),
        "engine_hit_rate": round(sum(r["cached"] for r in rows) / sum(r["prompt"] for r in rows), 3),
        "mean_ttft_s": round(sum(r["ttft"] for r in rows) / n, 4),
    }


# name -> (docs, sessions, turns, peer requests). "evicting": more documents than the two
# caches hold, so beliefs go stale by eviction; "peer-heavy": documents fit, and most of
# the traffic that warms them is the peer's, which only events reveal.
SCENARIOS = {"evicting": (10, 10, 4, 30), "peer-heavy": (6, 8, 3, 48)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="out/events.json")
    args = parser.parse_args()
    model = make_model(vllm_python(), REPO / ".cache" / "e2e-model")
    engines = []
    for cpu in (0, 1):
        engines.append(VllmServer(
            vllm_python(), model, free_port(), f"tcp://*:{free_port()}",
            f"tcp://127.0.0.1:{free_port()}", cpu,
            ("--num-gpu-blocks-override", "400")))  # the suite adds --enable-prompt-tokens-details
    t0 = time.perf_counter()
    results = []
    try:
        for e in engines:
            e.launch()
        for e in engines:
            e.wait_ready()
        for name in args.scenario or list(SCENARIOS):
            docs, sessions, turns, peers = SCENARIOS[name]
            shape = argparse.Namespace(docs=docs, sessions=sessions, turns=turns, peers=peers,
                                       seed=args.seed)
            for precise in (True, False):
                results.append({"scenario": name, **vars(shape),
                                **run(engines, model, precise, shape)})
    finally:
        for e in engines:
            e.stop()
    report = {"wall_s": round(time.perf_counter() - t0, 1), "runs": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
