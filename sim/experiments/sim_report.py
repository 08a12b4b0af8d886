"""Reports of a simulator ``Result``: markdown tables, the JSON document, matplotlib PNG plots.

- ``markdown(result)``: the comparisons (study) and the rows, one table each; columns are
  the row keys that every row shares plus the TTFT quantiles, floats to 3 decimals.
- ``write_json(result, path)``: the JSON contract (``Result.to_json``), indented.
- ``plot(result, path)``: one PNG per scenario: ``load`` and ``pool-pressure`` draw the
  median TTFT (with its bootstrap CI as a band) and p90 against the swept value, one line
  per policy and pool; the others draw grouped bars of median TTFT. Agg backend (no display).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.experiments import report
from sim.experiments.arms import Result

_HIDE = {"ttft_p50_ci", "session_p50_ci"}
_LEAD = ["policy", "pool", "load", "replicas", "pool_gib", "tokens", "case", "start_tokens", "tag"]


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    if columns is None:
        shared = [k for k in rows[0] if all(k in r for r in rows) and k not in _HIDE]
        columns = [k for k in _LEAD if k in shared] + [k for k in shared if k not in _LEAD]
    return report.table(rows, columns)


def markdown(result: Result) -> str:
    parts = [f"## lmroute sim {result.scenario}\n"]
    if result.comparisons:
        parts.append(table(result.comparisons, ["name", "study", "ours", "rel_error"]))
    figures = result.extra.get("paired")
    if figures:
        parts.append(table([{"figure": k, **v} for k, v in figures.items()],
                           ["figure", "n", "median_off", "median_on", "median_diff_s",
                            "median_diff_ci", "change_pct", "change_pct_ci", "wilcoxon_p"]))
    changes = result.extra.get("changes")
    if changes:
        parts.append(table(changes, ["policy", "start_tokens", "median_off", "median_on",
                                     "change_pct", "change_pct_ci"]))
    parts.append(table(result.rows))
    return "\n".join(parts)


def write_json(result: Result, path: str | Path) -> None:
    report.write_json(result.to_json(), path)


def plot(result: Result, path: str | Path) -> None:
    with report.figure(path) as (_, ax):
        if result.scenario in ("load", "pool-pressure"):
            _lines(ax, result)
        else:
            _bars(ax, result)
        ax.set_title(f"lmroute sim {result.scenario}")
        ax.grid(True, alpha=0.3)


def _lines(ax: Any, result: Result) -> None:
    x_key = "load" if result.scenario == "load" else "pool_gib"
    series: dict[str, list[dict[str, Any]]] = {}
    for r in result.rows:
        series.setdefault(f"{r['policy']} pool {r['pool']}", []).append(r)
    # One colour per policy; the line style tells the pool apart (solid: on).
    policies = list(dict.fromkeys(r["policy"] for r in result.rows))
    colour = {p: f"C{i % 10}" for i, p in enumerate(policies)}
    for name, rows in series.items():
        c = colour[rows[0]["policy"]]
        if result.scenario == "pool-pressure" and rows[0]["pool"] == "off":
            ax.axhline(rows[0]["ttft_p50_s"], color=c, linestyle=":", linewidth=1, label=name)
            continue
        rows.sort(key=lambda r: r[x_key])
        xs = [r[x_key] for r in rows]
        ax.plot(xs, [r["ttft_p50_s"] for r in rows], marker="o", color=c,
                linestyle="-" if rows[0]["pool"] == "on" else "--", label=name)
        ax.fill_between(xs, [r["ttft_p50_ci"][0] for r in rows],
                        [r["ttft_p50_ci"][1] for r in rows], color=c, alpha=0.15)
    ax.set_yscale("log")
    ax.set_ylabel("median TTFT, s (log; band: 95 % CI)")
    if x_key == "pool_gib":
        ax.set_xscale("log", base=2)
        ax.set_xlabel("pool capacity, GiB")
    else:
        ax.set_xlabel("load, sessions / min / replica")
    ax.legend(fontsize=7, ncol=2)


def _bars(ax: Any, result: Result) -> None:
    if result.comparisons:
        rows = [c for c in result.comparisons if "%" not in c["name"]]
        labels = [c["name"].replace("cross-replica ", "x ").replace("session ", "") for c in rows]
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [c["study"] for c in rows], 0.4, label="study")
        ax.bar([x + 0.2 for x in xs], [c["ours"] for c in rows], 0.4, label="simulated")
        ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("median, s (log)")
        ax.legend()
        return
    keys = [k for k in ("tokens", "case", "start_tokens") if k in result.rows[0]]
    groups = list(dict.fromkeys(" ".join(str(r[k]) for k in keys) for r in result.rows))
    arms = list(dict.fromkeys(f"{r['policy']} pool {r['pool']}" for r in result.rows))
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        vals = {" ".join(str(r[k]) for k in keys): r["ttft_p50_s"] for r in result.rows
                if f"{r['policy']} pool {r['pool']}" == arm}
        ax.bar([i + j * width - 0.4 + width / 2 for i in range(len(groups))],
               [vals.get(g, 0.0) for g in groups], width, label=arm)
    ax.set_xticks(range(len(groups)), groups, rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median TTFT, s (log)")
    ax.legend(fontsize=7)
