"""``lmroute live``: options, progress bar, table, JSON and plot for ``sim.live``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from sim.live import LiveConfig, run_live


def add_live_options(parser: argparse.ArgumentParser) -> None:
    d = LiveConfig(policies=())
    parser.add_argument("--policies", default=None,
                        help="comma-separated policies (default: every registered policy)")
    parser.add_argument("--loads", default=",".join(str(x) for x in d.loads),
                        help="session arrival rates, sessions per model second")
    parser.add_argument("--replicas", type=int, default=d.replicas)
    parser.add_argument("--pool", choices=("on", "off"), default="on")
    parser.add_argument("--sessions", type=int, default=d.sessions, help="sessions per cell")
    parser.add_argument("--turns", type=int, default=d.turns)
    parser.add_argument("--min-start-tokens", type=int, default=d.min_start_tokens)
    parser.add_argument("--max-start-tokens", type=int, default=d.max_start_tokens)
    parser.add_argument("--added-tokens", type=int, default=d.added_tokens)
    parser.add_argument("--think-s", type=float, default=d.think_s)
    parser.add_argument("--time-scale", type=float, default=d.time_scale)
    parser.add_argument("--profile", default=d.profile)
    parser.add_argument("--kill-at", type=float, default=None,
                        help="stop replica 0 at this model second of every cell")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--plot", dest="plot_path", default=None)


def table(doc: dict[str, Any]) -> str:
    lines = ["| load | policy | n | errors | TTFT mean | p50 | p90 | p99 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['load']} | {r['policy']} | {r['n']} | {r['errors']} | "
                     f"{r['ttft_mean_s']:.3f} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | "
                     f"{r['ttft_p99_s']:.3f} |")
    return "\n".join(lines)


def failover_summary(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Per policy, with ``--kill-at``: the first turn of each session that had to leave the
    lost replica, against that policy's own pool-hit and GPU-hit turns (model seconds)."""
    kill = doc["params"]["kill_at"]
    out = []
    for policy in dict.fromkeys(t["policy"] for t in doc["turns"]):
        turns = sorted((t for t in doc["turns"] if t["policy"] == policy and "ttft_s" in t),
                       key=lambda t: t["sent_s"])
        lost = turns[0]["lost_replica"] if turns else None
        last: dict[int, str] = {}
        moved: list[float] = []
        for t in turns:
            if t["sent_s"] >= kill and last.get(t["session"]) == lost:
                moved.append(t["ttft_s"])
            last[t["session"]] = t["replica"]
        pool = [t["ttft_s"] for t in turns if t["reason"] == "pool-hit"]
        cold = [t["ttft_s"] for t in turns if t["turn"] == 0]
        out.append({"policy": policy, "moved_sessions": len(moved),
                    "moved_first_turn_ttft_median_s": _median(moved),
                    "pool_hit_ttft_median_s": _median(pool),
                    "first_turn_ttft_median_s": _median(cold)})
    return out


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def plot(doc: dict[str, Any], path: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    policies = list(dict.fromkeys(r["policy"] for r in doc["rows"]))
    for policy in policies:
        rows = sorted((r for r in doc["rows"] if r["policy"] == policy), key=lambda r: r["load"])
        loads = [r["load"] for r in rows]
        style = {"linewidth": 2.5} if policy == "locality" else {"linewidth": 1.2}
        axes[0].plot(loads, [r["ttft_mean_s"] for r in rows], marker="o", label=policy, **style)
        axes[1].plot(loads, [r["ttft_p90_s"] for r in rows], marker="o", label=policy, **style)
    for ax, title in zip(axes, ("mean TTFT", "p90 TTFT"), strict=True):
        ax.set_title(title)
        ax.set_xlabel("session arrivals per model second")
        ax.set_ylabel("model seconds")
        ax.set_yscale("log")
        # Plain numbers on the log axis: "2.6", not "2.6 x 10^0".
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.1f"))
        ax.grid(alpha=0.3)
    axes[0].legend()
    p = doc["params"]
    fig.suptitle(f"live: {p['replicas']} emulated replicas ({p['profile']}), pool "
                 f"{'on' if p['pool'] else 'off'}, {p['sessions']} sessions x {p['turns']} turns")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from policies import registry

    known = registry.names()
    policies = tuple(p for p in (args.policies or ",".join(known)).split(",") if p)
    unknown = [p for p in policies if p not in known]
    if unknown:
        print(f"lmroute live: unknown policies {unknown}; known: {known}", file=sys.stderr)
        return 2
    cfg = LiveConfig(
        policies=policies, loads=tuple(float(x) for x in args.loads.split(",") if x),
        replicas=args.replicas, pool=args.pool == "on", sessions=args.sessions,
        turns=args.turns, min_start_tokens=args.min_start_tokens,
        max_start_tokens=args.max_start_tokens, added_tokens=args.added_tokens,
        think_s=args.think_s, time_scale=args.time_scale, profile=args.profile,
        kill_at=args.kill_at, seed=args.seed)
    total = len(cfg.loads) * len(cfg.policies) * cfg.sessions * cfg.turns
    with Progress() as progress:
        task = progress.add_task("live load", total=total)
        doc = asyncio.run(run_live(cfg, lambda: progress.advance(task)))
    print(table(doc))
    if cfg.kill_at is not None:
        doc["failover"] = failover_summary(doc)
        for row in doc["failover"]:
            print(row)
    print(f"wall time {doc['wall_s']:.0f} s")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    if args.plot_path:
        plot(doc, args.plot_path)
    return 0
