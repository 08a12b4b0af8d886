"""``lmroute ab``'s report: the analysis merged into the run document, markdown, a PNG.

- ``report(doc)``: the analysis (``sim.experiments.ab_stats.analyze``) merged into the run document:
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

from pathlib import Path
from typing import Any

import numpy as np

from sim.experiments.ab import AbConfig
from sim.experiments.ab_stats import analyze
from sim.experiments.report import figure, fmt, plain_log_axis


def report(doc: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    specs = {a.label: a.spec for a in AbConfig.from_json(doc["config"]).validate()}
    return doc | analyze(doc["turns"], specs, seed=seed)


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
                     f"{fmt(a['ttft_p50_s'])} | {fmt(a['ttft_p90_s'])} | {fmt(a['ttft_mean_s'])} | "
                     f"{fmt(a['session_s'], 2)} | {a['errors']} |")
    d = doc["difference"]
    lines += ["", "| B - A | estimate | 95 % CI | Hodges-Lehmann | Mann-Whitney p |",
              "|---|---|---|---|---|",
              f"| median TTFT | {fmt(d['estimate'])} ({fmt(d['change_pct'], 1)} %) | "
              f"[{fmt(d['ci_low'])}, {fmt(d['ci_high'])}] | {fmt(d['hl_shift_s'])} | "
              f"{d['p_value']:.2g} |", "",
              f"Verdict: {doc['verdict']}", "",
              f"Times in {doc['units']}; CI: stratified session bootstrap ({d['resamples']} "
              f"resamples); HL and p over per-session medians. Wall time "
              f"{doc.get('wall_s', 0.0):.0f} s."]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: str | Path) -> None:
    with figure(path, 2, (10, 4.2)) as (fig, (ecdf, drift)):
        _ecdf(ecdf, doc)
        _drift(drift, doc)
        d = doc["difference"]
        fig.suptitle(f"{doc['config']['arms']}: B - A median TTFT {d['estimate']:+.3f} s, "
                     f"95 % CI [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]", fontsize=10)


_COLOUR = {"A": "C0", "B": "C3"}


def _ecdf(ecdf: Any, doc: dict[str, Any]) -> None:
    colour = _COLOUR
    for a in doc["arms"]:
        x = np.sort([t["ttft_s"] for t in doc["turns"]
                     if t["arm"] == a["name"] and t.get("ttft_s") is not None])
        if x.size:
            ecdf.step(x, np.arange(1, x.size + 1) / x.size, where="post",
                      color=colour[a["name"]], label=f"{a['name']}: {a['spec']} (n={x.size})")
            ecdf.axvline(a["ttft_p50_s"], color=colour[a["name"]], linestyle=":", linewidth=1)
    ecdf.set_xscale("log")
    plain_log_axis(ecdf.xaxis)
    ecdf.set_xlabel("TTFT, s (log; dotted: median)")
    ecdf.set_ylabel("fraction of turns")
    ecdf.legend(fontsize=8)
    ecdf.grid(True, alpha=0.3)


def _drift(drift: Any, doc: dict[str, Any]) -> None:
    colour = _COLOUR
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
