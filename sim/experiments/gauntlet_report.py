"""The gauntlet's statistics and report: per-cell CIs, locality / best-other ratios, capacity.

Statistics (seeds are the replications; each seed's value is one simulation's mean or p90
TTFT of its measured requests):

- ``rows``: per (cell, load, policy) the mean over seeds of the per-seed mean and p90
  TTFT, each with a t-based 95 % CI (``mean +- t(0.975, n-1) * sd / sqrt(n)``; with one
  seed the CI is the value itself).
- ``ratios``: per (cell, load) the best other policy (lowest mean-over-seeds metric among
  the non-``locality`` policies, chosen separately for p90 and mean) and locality's ratio
  to it, paired by seed: the geometric mean of the per-seed ratios ``loc_s / best_s``,
  with the t-based 95 % CI of the mean log ratio, exponentiated. < 1: locality is faster.
- ``capacity``: per (cell, policy) the highest load multiplier up to which (every lower
  one included) the policy's mean-over-seeds p90 stays at or under the workload's SLO
  (``knees[w]["slo_p90_s"]``: 5x the base cell's light-load best p90); 0 when even the
  lowest load misses it.

Outputs: ``document`` (the JSON), ``markdown`` (tables for stdout), ``heatmap`` (PNG: rows
= cells, columns = loads, colour = log2 of the ratio, p90 and mean side by side,
annotated with the ratio; green < 1 < red).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

from sim.experiments import report

Groups = dict[tuple[Any, ...], dict[str, dict[int, dict[str, Any]]]]
CELL_KEYS = ("cell", "axis", "workload", "hardware", "replicas", "routers")
METRICS = ("p90", "mean")


def t_ci(values: Sequence[float]) -> tuple[float, list[float]]:
    """Mean and t-based 95 % CI of ``values`` (NaNs dropped; one value: a zero-width CI)."""
    x = np.asarray([v for v in values if v == v], dtype=float)
    if x.size == 0:
        return math.nan, [math.nan, math.nan]
    m = float(x.mean())
    if x.size == 1:
        return m, [m, m]
    half = float(sps.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, [m - half, m + half]


def _is_locality(policy: str) -> bool:
    return policy.split("@")[0].split("+")[0] == "locality"


def _groups(raw: Sequence[dict[str, Any]]) -> Groups:
    """(cell, load) -> policy -> seed -> raw row, in first-seen order."""
    out: Groups = {}
    for r in raw:
        key = (*(r[k] for k in CELL_KEYS), r["load"], r["rate_scale"])
        out.setdefault(key, {}).setdefault(r["policy"], {})[r["seed"]] = r
    return out


def aggregate_rows(raw: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (cell, load, policy): mean and p90 TTFT, mean over seeds with t CIs."""
    rows = []
    for key, by_policy in _groups(raw).items():
        base = dict(zip((*CELL_KEYS, "load", "rate_scale"), key, strict=True))
        for policy, seeds in by_policy.items():
            row: dict[str, Any] = {**base, "policy": policy, "seeds": len(seeds),
                                   "n": sum(s["n"] for s in seeds.values())}
            for m in METRICS:
                vals = [seeds[s][m] for s in sorted(seeds)]
                row[f"ttft_{m}_s"], row[f"ttft_{m}_ci"] = t_ci(vals)
                row[f"ttft_{m}_per_seed"] = vals
            rows.append(row)
    return rows


def _ratio(loc: dict[int, dict[str, Any]], other: dict[int, dict[str, Any]],
           metric: str) -> tuple[float, list[float]]:
    logs = [math.log(loc[s][metric] / other[s][metric]) for s in sorted(loc)
            if s in other and loc[s][metric] > 0 and other[s][metric] > 0]
    m, ci = t_ci(logs)
    return math.exp(m) if m == m else math.nan, [math.exp(v) if v == v else math.nan for v in ci]


def ratios(raw: Sequence[dict[str, Any]], target: str = "locality") -> list[dict[str, Any]]:
    """Per (cell, load): locality's ratio to the best other policy, paired by seed."""
    out = []
    for key, by_policy in _groups(raw).items():
        if target not in by_policy:
            continue
        others = {p: s for p, s in by_policy.items() if not _is_locality(p)}
        if not others:
            continue
        row: dict[str, Any] = dict(zip((*CELL_KEYS, "load", "rate_scale"), key, strict=True))
        for m in METRICS:
            mean_of = {p: float(np.nanmean([v[m] for v in s.values()])) for p, s in others.items()}
            best = min(mean_of, key=lambda p: mean_of[p] if mean_of[p] == mean_of[p] else math.inf)
            row[f"best_other_{m}"] = best
            row[f"best_other_{m}_s"] = mean_of[best]
            row[f"locality_{m}_s"] = float(np.nanmean([v[m] for v in by_policy[target].values()]))
            row[f"ratio_{m}"], row[f"ratio_{m}_ci"] = _ratio(by_policy[target], others[best], m)
        out.append(row)
    return out


def capacity(rows: Sequence[dict[str, Any]], knees: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (cell, policy): the highest load multiplier whose p90 stays within the SLO."""
    series: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        series.setdefault((*(r[k] for k in CELL_KEYS), r["policy"]), []).append(r)
    out = []
    for key, rs in series.items():
        slo = knees.get(key[2], {}).get("slo_p90_s", math.nan)
        cap = 0.0
        for r in sorted(rs, key=lambda r: r["load"]):
            if not r["ttft_p90_s"] <= slo:
                break
            cap = r["load"]
        out.append({**dict(zip(CELL_KEYS, key[:-1], strict=True)), "policy": key[-1],
                    "slo_p90_s": slo, "capacity": cap if slo == slo else None})
    return out


def document(params: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of a gauntlet run (``run``: ``gauntlet.run_gauntlet``'s output)."""
    rows = aggregate_rows(run["raw"])
    return {"scenario": "gauntlet", "params": {**params, "policies": run["policies"],
                                               "baselines": run["baselines"]},
            "knees": run["knees"], "cells": run["cells"], "skipped": run["skipped"],
            "rows": rows, "ratios": ratios(run["raw"]), "capacity": capacity(rows, run["knees"]),
            "raw": run["raw"], "wall_s": run["wall_s"]}


def _ci(v: float, ci: Sequence[float]) -> str:
    return f"{report.fmt(v, 2)} [{report.fmt(ci[0], 2)}, {report.fmt(ci[1], 2)}]"


def markdown(doc: dict[str, Any]) -> str:
    """Knees, the ratio table (the headline), capacity and skipped cells, as markdown."""
    parts = ["## lmroute sim gauntlet\n", "### Knees (base cell: best baseline p90 = 5x light)\n",
             report.table([{"workload": w, **{k: v for k, v in k_.items() if k != "probes"}}
                           for w, k_ in doc["knees"].items()],
                          ["workload", "rate_scale", "light_p90_s", "slo_p90_s", "given"])]
    head = [{"cell": r["cell"], "load": r["load"],
             "locality p90": r["locality_p90_s"], "best other p90": r["best_other_p90_s"],
             "best other": r["best_other_p90"], "ratio p90 [95% CI]": _ci(r["ratio_p90"],
                                                                          r["ratio_p90_ci"]),
             "ratio mean [95% CI]": _ci(r["ratio_mean"], r["ratio_mean_ci"])}
            for r in doc["ratios"]]
    if head:
        parts += ["### locality / best other policy (TTFT; < 1: locality faster)\n",
                  report.table(head, list(head[0]))]
    cap = doc["capacity"]
    if cap:
        pols = list(dict.fromkeys(c["policy"] for c in cap))
        by_cell: dict[str, dict[str, Any]] = {}
        for c in cap:
            by_cell.setdefault(c["cell"], {"cell": c["cell"], "SLO p90 s": c["slo_p90_s"]})[
                c["policy"]] = c["capacity"]
        parts += ["### Capacity: highest knee multiple with p90 within the SLO\n",
                  report.table(list(by_cell.values()), ["cell", "SLO p90 s", *pols])]
    if doc["skipped"]:
        parts += ["### Skipped cells\n", report.table(doc["skipped"], ["cell", "axis", "reason"])]
    return "\n".join(parts)


def heatmap(doc: dict[str, Any], path: str | Path) -> None:
    """Rows = cells, columns = loads, colour = log2(locality / best other), p90 and mean
    (``doc["target"]``, where set, is the policy judged instead of ``locality``)."""
    who = doc.get("target", "locality")
    cells = list(dict.fromkeys(r["cell"] for r in doc["ratios"]))
    loads = sorted({r["load"] for r in doc["ratios"]})
    height = max(3.0, 0.35 * len(cells) + 1.5)
    with report.figure(path, ncols=2, figsize=(4 + 1.2 * len(loads) * 2, height),
                       squeeze=False) as (fig, axes):
        for ax, m in zip(axes[0], METRICS, strict=True):
            grid = np.full((max(1, len(cells)), max(1, len(loads))), np.nan)
            for r in doc["ratios"]:
                grid[cells.index(r["cell"]), loads.index(r["load"])] = r[f"ratio_{m}"]
            logs = np.log2(grid)
            image = ax.imshow(logs, cmap="RdYlGn_r", vmin=-1, vmax=1, aspect="auto")
            for (i, j), v in np.ndenumerate(grid):
                if v == v:
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7)
            ax.set_xticks(range(len(loads)), [f"{x:g}" for x in loads])
            ax.set_yticks(range(len(cells)), cells, fontsize=7)
            ax.set_xlabel("load, x knee")
            ax.set_title(f"{who} / best other, {m} TTFT", fontsize=8 if len(who) > 20 else None)
        fig.colorbar(image, ax=axes[0, 1], label=f"log2 ratio (green: {who.split('@')[0]} faster)")
