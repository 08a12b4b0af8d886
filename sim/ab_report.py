"""``lmroute ab`` in the terminal: options, progress bar, markdown report, JSON and PNG.

- ``report(doc)``: the analysis (``sim.ab_stats.analyze``) merged into the run document:
  ``{"arms": [{"name", "spec", "n", "ttft_p50_s", "ttft_p90_s", "ttft_mean_s", "errors",
  "sessions", "session_s"}], "difference": {"metric": "ttft_p50_s", "estimate", "ci_low",
  "ci_high", "p_value", "hl_shift_s", "change_pct"}, "verdict", "blocks", "config",
  "turns", "done", "wall_s"}``.
- ``markdown(doc)``: the per-arm table, the difference and the verdict.
- ``plot(doc, path)``: left, the ECDF of TTFT per arm (log x); right, the median TTFT of
  every block in run order, coloured by arm (drift shows as a trend across blocks).
  Agg backend, no display.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from sim.ab import AbConfig, run_ab
from sim.ab_stats import analyze


def report(doc: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    specs = {a.label: a.spec for a in AbConfig.from_json(doc["config"]).validate()}
    return doc | analyze(doc["turns"], specs, seed=seed)


def _f(v: Any, digits: int = 3) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    where = "emulated (" + cfg["profile"] + f", time scale {cfg['time_scale']})" \
        if cfg["emulated"] else cfg["target"]
    lines = [f"## lmroute ab: {cfg['arms']} ({cfg['design']}, {cfg['blocks']} blocks x "
             f"{cfg['sessions_per_block']} sessions x {cfg['turns']} turns, {where})", "",
             "| arm | spec | n | sessions | TTFT p50 | TTFT p90 | TTFT mean | session | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for a in doc["arms"]:
        lines.append(f"| {a['name']} | {a['spec']} | {a['n']} | {a['sessions']} | "
                     f"{_f(a['ttft_p50_s'])} | {_f(a['ttft_p90_s'])} | {_f(a['ttft_mean_s'])} | "
                     f"{_f(a['session_s'], 2)} | {a['errors']} |")
    d = doc["difference"]
    lines += ["", "| B - A | estimate | 95 % CI | Hodges-Lehmann | Mann-Whitney p |",
              "|---|---|---|---|---|",
              f"| median TTFT | {_f(d['estimate'])} ({_f(d['change_pct'], 1)} %) | "
              f"[{_f(d['ci_low'])}, {_f(d['ci_high'])}] | {_f(d['hl_shift_s'])} | "
              f"{d['p_value']:.2g} |", "",
              f"Verdict: {doc['verdict']}", "",
              f"Times in {doc['units']}; CI: stratified session bootstrap ({d['resamples']} "
              f"resamples); HL and p over per-session medians. Wall time "
              f"{doc.get('wall_s', 0.0):.0f} s."]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ecdf, drift) = plt.subplots(1, 2, figsize=(10, 4.2))
    colour = {"A": "C0", "B": "C3"}
    for a in doc["arms"]:
        x = np.sort([t["ttft_s"] for t in doc["turns"]
                     if t["arm"] == a["name"] and t.get("ttft_s") is not None])
        if x.size:
            ecdf.step(x, np.arange(1, x.size + 1) / x.size, where="post",
                      color=colour[a["name"]], label=f"{a['name']}: {a['spec']} (n={x.size})")
            ecdf.axvline(a["ttft_p50_s"], color=colour[a["name"]], linestyle=":", linewidth=1)
    ecdf.set_xscale("log")
    ecdf.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ecdf.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ecdf.set_xlabel("TTFT, s (log; dotted: median)")
    ecdf.set_ylabel("fraction of turns")
    ecdf.legend(fontsize=8)
    ecdf.grid(True, alpha=0.3)
    for label in ("A", "B"):
        rows = [b for b in doc["blocks"] if b["arm"] == label]
        drift.plot([b["block"] + 1 for b in rows], [b["ttft_p50_s"] for b in rows], "o",
                   color=colour[label], label=label, markersize=8)
    drift.set_xticks(range(1, doc["config"]["blocks"] + 1))
    drift.set_xlabel("block (run order)")
    drift.set_ylabel("median TTFT in block, s")
    drift.set_ylim(bottom=0)
    drift.legend(fontsize=8)
    drift.grid(True, alpha=0.3)
    d = doc["difference"]
    fig.suptitle(f"{doc['config']['arms']}: B - A median TTFT {d['estimate']:+.3f} s, "
                 f"95 % CI [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_json(doc: dict[str, Any], path: str | Path) -> None:
    """Atomic: a run interrupted mid-write still leaves the previous document to resume."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def add_ab_options(p: argparse.ArgumentParser) -> None:
    d = AbConfig(arms="")
    p.add_argument("--arms", help="two arms A,B: POLICY[@KEY=VALUE...], e.g. fixed,round_robin "
                                  "or alternating@pool=off,alternating@pool=on")
    p.add_argument("--target", default="", help="router base URL (a real deployment)")
    p.add_argument("--emulated", action="store_true",
                   help="start two emulated replicas sharing a pool and a router here")
    p.add_argument("--pool", default=d.pool, help="emulated pool on|off (arms may override)")
    p.add_argument("--design", default=d.design, help="abba | interleaved")
    p.add_argument("--blocks", type=int, default=d.blocks)
    p.add_argument("--sessions-per-block", type=int, default=d.sessions_per_block)
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--min-start-tokens", type=int, default=d.min_start_tokens)
    p.add_argument("--max-start-tokens", type=int, default=d.max_start_tokens)
    p.add_argument("--added-tokens", type=int, default=d.added_tokens)
    p.add_argument("--output-tokens", type=int, default=d.output_tokens,
                   help="reply length (a cap in trace mode)")
    p.add_argument("--concurrency", type=int, default=d.concurrency,
                   help="sessions in flight at once")
    p.add_argument("--profile", default=d.profile, help="emulated replica profile")
    p.add_argument("--time-scale", type=float, default=d.time_scale,
                   help="emulated: wall seconds per model second")
    p.add_argument("--trace", default="", help="Mooncake-format JSONL trace to replay")
    p.add_argument("--model", default=d.model, help="model name sent in requests")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--admin-key", default=os.environ.get("LMROUTE_ADMIN_KEY", ""),
                   help="the router's admin key (env LMROUTE_ADMIN_KEY; emulated: generated)")
    p.add_argument("--json", dest="json_path", default=None, help="write the document here")
    p.add_argument("--plot", dest="plot_path", default=None, help="write a PNG here")
    p.add_argument("--resume", default=None, help="continue the run saved in this JSON")


def _config(args: argparse.Namespace) -> tuple[AbConfig, dict[str, Any] | None]:
    if args.resume:
        doc: dict[str, Any] = json.loads(Path(args.resume).read_text(encoding="utf-8"))
        return AbConfig.from_json(doc["config"]), doc
    if not args.arms:
        raise ValueError("--arms A,B is required (or --resume PATH)")
    return AbConfig(arms=args.arms, design=args.design, blocks=args.blocks,
                    sessions_per_block=args.sessions_per_block, turns=args.turns,
                    min_start_tokens=args.min_start_tokens, max_start_tokens=args.max_start_tokens,
                    added_tokens=args.added_tokens, output_tokens=args.output_tokens,
                    concurrency=args.concurrency, target=args.target, emulated=args.emulated,
                    pool=args.pool, profile=args.profile, time_scale=args.time_scale,
                    trace=args.trace, model=args.model, seed=args.seed), None


def main(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        cfg, resumed = _config(args)
        cfg.validate()
    except (ValueError, OSError, KeyError) as exc:
        print(f"lmroute ab: {exc}", file=sys.stderr)
        return 2
    json_path = args.json_path or args.resume

    def save(doc: dict[str, Any]) -> None:
        if json_path:
            write_json(doc, json_path)

    total = cfg.blocks * cfg.sessions_per_block * cfg.turns
    done = len(resumed["turns"]) if resumed else 0
    with Progress(TextColumn("ab"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("turns", total=total, completed=done)
        try:
            doc = asyncio.run(run_ab(cfg, admin_key=args.admin_key, resume=resumed, save=save,
                                     on_turn=lambda: bar.advance(task)))
        except (ValueError, RuntimeError, OSError) as exc:
            print(f"lmroute ab: {exc}", file=sys.stderr)
            return 1
    doc = report(doc, cfg.seed)
    print(markdown(doc))
    save(doc)
    if args.plot_path:
        plot(doc, args.plot_path)
    return 0
