"""Plot and tabulate ``bench/vllm_policies.py`` runs of one workload at several loads.

Each JSON is one ``vllm_policies.py`` run at one load (``--rate`` for ``prefix``,
``--chat-speed`` for ``chat``); per load and policy: mean and p90 TTFT (means over the
repetitions), the engines' prefix-cache hit rate and the busier engine's share, and
``locality`` over each other policy as the geometric mean of the per-repetition ratios
with a 95 % t-interval (repetitions share a prompt set, so the ratio is paired).

    .venv/bin/python bench/vllm_loads.py docs/vllm-pinned-prefix-r8.json \\
        docs/vllm-pinned-prefix-r48.json docs/vllm-pinned-prefix-r96.json \\
        --plot docs/vllm-pinned-prefix.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from vllm_policies import t_interval


def load_of(doc: dict[str, Any], workload: str) -> float:
    params = doc["params"]
    return float(params["rate"] if workload == "prefix" else params["chat_speed"])


def paired(runs: list[dict[str, Any]], policy: str, metric: str) -> tuple[float, float, float]:
    """locality / ``policy`` on ``metric``: geometric mean and 95 % t-interval over seeds
    (``vllm_policies.t_interval`` of the log ratios)."""
    by = {(r["policy"], r["seed"]): r[metric] for r in runs}
    logs = [float(np.log(by[("locality", s)] / by[(policy, s)])) for p, s in by
            if p == policy and ("locality", s) in by]
    mean, low, high = t_interval(logs)
    return float(np.exp(mean)), float(np.exp(low)), float(np.exp(high))


def rows(docs: list[dict[str, Any]], workload: str) -> list[dict[str, Any]]:
    out = []
    for doc in sorted(docs, key=lambda d: load_of(d, workload)):
        runs = [r for r in doc["runs"] if r["workload"] == workload]
        for policy in sorted({r["policy"] for r in runs}):
            mine = [r for r in runs if r["policy"] == policy]
            row = {"load": load_of(doc, workload), "policy": policy, "reps": len(mine)}
            for key in ("mean_ttft_s", "p90_ttft_s", "hit_rate", "max_share"):
                row[key] = float(np.mean([r[key] for r in mine]))
            if policy != "locality" and any(r["policy"] == "locality" for r in runs):
                row["locality_over"] = {m: paired(runs, policy, m)
                                        for m in ("mean_ttft_s", "p90_ttft_s")}
            out.append(row)
    return out


def markdown(table: list[dict[str, Any]], workload: str) -> str:
    unit = "req/s" if workload == "prefix" else "x trace speed"
    lines = [f"| load ({unit}) | policy | reps | mean TTFT (s) | p90 TTFT (s) | hit rate | "
             "busier share | locality / this: mean [95 % CI] | p90 |", "|---" * 9 + "|"]
    for r in table:
        over = r.get("locality_over")
        ratio = (" | ".join(f"{m:.2f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in
                            (over["mean_ttft_s"], over["p90_ttft_s"])) if over else "- | -")
        lines.append(f"| {r['load']:g} | {r['policy']} | {r['reps']} | {r['mean_ttft_s']:.3f} | "
                     f"{r['p90_ttft_s']:.3f} | {r['hit_rate']:.3f} | {r['max_share']:.2f} | "
                     f"{ratio} |")
    return "\n".join(lines)


def plot(table: list[dict[str, Any]], workload: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for policy in sorted({r["policy"] for r in table}):
        mine = [r for r in table if r["policy"] == policy]
        loads = [r["load"] for r in mine]
        style = {"lw": 2.5, "color": "black"} if policy == "locality" else {"lw": 1.2}
        axes[0].plot(loads, [r["p90_ttft_s"] for r in mine], "o-", label=policy, **style)
        axes[1].plot(loads, [r["hit_rate"] for r in mine], "o-", label=policy, **style)
        axes[2].plot(loads, [r["max_share"] for r in mine], "o-", label=policy, **style)
    unit = "requests/s" if workload == "prefix" else "trace speed-up"
    for ax, title in zip(axes, ("p90 TTFT (s)", "engines' prefix-cache hit rate",
                                "busier engine's share"), strict=True):
        ax.set_title(f"{workload}: {title}", fontsize=9)
        ax.set_xlabel(unit)
    axes[0].set_yscale("log")
    axes[2].set_ylim(0.45, 1.02)  # from an even split to all on one engine
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", type=Path)
    ap.add_argument("--workload", default="prefix", choices=("prefix", "chat"))
    ap.add_argument("--plot")
    args = ap.parse_args()
    table = rows([json.loads(p.read_text()) for p in args.json], args.workload)
    print(markdown(table, args.workload))
    if args.plot:
        plot(table, args.workload, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
