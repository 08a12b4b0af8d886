"""Figures, ratios, table and plot for ``peers.py``'s cells.

Per round and target: non-streamed and streamed req/s (``wrk -c64``), router CPU per
request (us), CPU per SSE event on paced streams (us; events = completed streams x events
per stream, ``[DONE]`` included), and added latency at one connection (router p50/p99
minus direct p50/p99 of the same round). Each figure is divided by the baseline's
(sglang-router cache_aware) in the same round; the reported ratio is the median over
rounds. For throughput a ratio above 1 is better; for CPU and latency, below 1.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

METRICS = (  # key, label, higher is better
    ("nonstream_rps", "req/s non-stream", True),
    ("stream_rps", "req/s stream", True),
    ("cpu_per_req_us", "CPU us/req non-stream", False),
    ("cpu_per_stream_req_us", "CPU us/req stream", False),
    ("cpu_per_event_us", "CPU us/SSE event (paced)", False),
    ("added_p50_ms", "added p50 ms (c1)", False),
    ("added_p99_ms", "added p99 ms (c1)", False),
)
DONE_WHEN = {"nonstream_rps": (">=", 0.5), "cpu_per_event_us": ("<=", 1.5),
             "added_p50_ms": ("<=", 1.5)}


def figures(doc: dict[str, Any]) -> dict[int, dict[str, dict[str, float]]]:
    """round -> target -> metric -> value."""
    events = doc["events_per_paced_stream"]
    out: dict[int, dict[str, dict[str, float]]] = {}
    direct = {c["round"]: c for c in doc["cells"] if c["target"] == "direct"}
    for c in doc["cells"]:
        if c["target"] == "direct":
            continue
        f = out.setdefault(c["round"], {}).setdefault(c["target"], {})
        n = max(1, c["requests"])
        if c["kind"] == "nonstream":
            f["nonstream_rps"] = c["rps"]
            f["cpu_per_req_us"] = c["router_cpu_s"] / n * 1e6
        elif c["kind"] == "stream":
            f["stream_rps"] = c["rps"]
            f["cpu_per_stream_req_us"] = c["router_cpu_s"] / n * 1e6
        elif c["kind"] == "paced":
            f["paced_rps"] = c["rps"]
            f["cpu_per_event_us"] = c["router_cpu_s"] / (n * events) * 1e6
        elif c["kind"] == "c1":
            d = direct[c["round"]]
            f["added_p50_ms"] = c["p50_ms"] - d["p50_ms"]
            f["added_p99_ms"] = c["p99_ms"] - d["p99_ms"]
    return out


def ratios(doc: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """target -> metric -> {"value": median, "ratio": median of per-round ratios}."""
    base = doc["baseline"]
    per_round = figures(doc)
    targets = list(dict.fromkeys(t for r in per_round.values() for t in r))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for t in targets:
        out[t] = {}
        for key, _, _ in METRICS:
            vals = [r[t][key] for r in per_round.values() if key in r.get(t, {})]
            rats = [r[t][key] / r[base][key] for r in per_round.values()
                    if key in r.get(t, {}) and r.get(base, {}).get(key)]
            if vals:
                out[t][key] = {"value": statistics.median(vals),
                               "ratio": statistics.median(rats) if rats else float("nan")}
    return out


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def table(doc: dict[str, Any]) -> str:
    r = doc.get("ratios") or ratios(doc)
    head = "| target | " + " | ".join(label for _, label, _ in METRICS) + " |"
    lines = [head, "|---" * (len(METRICS) + 1) + "|"]
    for t, m in r.items():
        cells = [f"{_fmt(m[k]['value'])} ({m[k]['ratio']:.2f}x)" if k in m else "-"
                 for k, _, _ in METRICS]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Each cell: the median over rounds, and (in brackets) the median over rounds "
                 f"of its ratio to {doc['baseline']} in the same round.")
    checks = []
    for t, m in r.items():
        if not t.startswith("lmroute"):
            continue
        for key, (op, bar) in DONE_WHEN.items():
            if key in m:
                ok = m[key]["ratio"] >= bar if op == ">=" else m[key]["ratio"] <= bar
                checks.append(f"{t} {key} {m[key]['ratio']:.2f}x {op} {bar}: "
                              f"{'met' if ok else 'NOT met'}")
    return "\n".join([*lines, "", "Done-when (ratios):", *(f"- {c}" for c in checks)])


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = doc.get("ratios") or ratios(doc)
    targets = list(r)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(3.2 * len(METRICS), 3.8), sharey=True)
    for ax, (key, label, higher) in zip(axes, METRICS, strict=True):
        vals = [r[t].get(key, {}).get("ratio", float("nan")) for t in targets]
        colors = ["tab:orange" if t.startswith("lmroute") else "tab:blue" for t in targets]
        ax.barh(range(len(targets)), vals, color=colors)
        ax.axvline(1.0, color="k", lw=0.8)
        if key in DONE_WHEN:
            ax.axvline(DONE_WHEN[key][1], color="tab:red", ls="--", lw=0.8)
        ax.set_title(f"{label}\n({'higher' if higher else 'lower'} is better)", fontsize=8)
        ax.set_yticks(range(len(targets)), targets, fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"x {doc['baseline']} (same run); red: done-when bar", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
