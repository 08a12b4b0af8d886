"""Presenting ``lmroute demo`` results: a rich progress bar and table, JSON, a PNG plot.

Table: two rows per policy (pool off, on): median TTFT (all turns, turns 2+), mean TTFT
of turns 2+, mean session time, and the session time's change when the pool is turned on.
Plot (matplotlib, Agg backend, no display): mean session time per policy, pool off vs on,
beside the mean TTFT of turns 2+ (the turns a pool can help; the mean keeps the
cold second turn of a moved session that a median would hide).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


@contextlib.contextmanager
def progress(total: int) -> Iterator[Callable[[], None]]:
    """A progress bar over ``total`` turns; yields the function that advances it."""
    with Progress(TextColumn("demo"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        task = bar.add_task("turns", total=total)
        yield lambda: bar.advance(task)


def _cells(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["policy"], r["pool"]): r for r in result["results"]}


def build_table(result: dict[str, Any]) -> Table:
    cfg = result["config"]
    table = Table(title=(f"{cfg['sessions']} sessions x {cfg['turns']} turns per cell, "
                         f"{cfg['start_tokens']:,}-token start, profile {cfg['profile']}; "
                         "model seconds"),
                  caption=(f"2+: turns 2 and later; session: mean session time; change: "
                           f"session time, pool on vs off. Wall time {result['wall_s']:.0f} s, "
                           f"time scale {cfg['time_scale']}"))
    for name in ("policy", "pool", "TTFT p50", "2+ p50", "2+ mean", "session", "change"):
        table.add_column(name, justify="left" if name in ("policy", "pool") else "right",
                         no_wrap=name == "policy")
    cells = _cells(result)
    for policy in result["config"]["policies"]:
        for pool in ("off", "on"):
            c = cells[policy, pool]
            change = result["session_change_with_pool_pct"][policy]
            table.add_row(
                policy if pool == "off" else "", pool, f"{c['median_ttft_s']:.3f}",
                f"{c['median_ttft_later_turns_s'] or 0:.3f}",
                f"{c['mean_ttft_later_turns_s'] or 0:.3f}", f"{c['mean_session_s']:.2f}",
                f"{change:+.1f} %" if pool == "on" else "",
                end_section=pool == "on",
            )
    return table


def print_table(result: dict[str, Any], console: Console | None = None) -> None:
    (console or Console()).print(build_table(result))


def write_json(result: dict[str, Any], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))


def write_plot(result: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt
    import numpy as np

    policies = list(result["config"]["policies"])
    cells = _cells(result)
    x = np.arange(len(policies))
    width = 0.38
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for offset, pool, color in ((-width / 2, "off", "#9aa5b1"), (width / 2, "on", "#2f7ed8")):
        sessions = [cells[p, pool]["mean_session_s"] for p in policies]
        later = [cells[p, pool]["mean_ttft_later_turns_s"] or 0.0 for p in policies]
        left.bar(x + offset, sessions, width, label=f"pool {pool}", color=color)
        right.bar(x + offset, later, width, label=f"pool {pool}", color=color)
    left.set_title("mean session time (6 turns)" if result["config"]["turns"] == 6
                   else "mean session time")
    left.set_ylabel("model seconds")
    right.set_title("mean TTFT, turns 2+")
    right.set_ylabel("model seconds")
    for ax in (left, right):
        ax.set_xticks(x, policies, rotation=20)
        ax.legend(loc="lower right", framealpha=0.9)
        ax.grid(axis="y", alpha=0.3)
    cfg = result["config"]
    fig.suptitle(f"lmroute demo: two emulated {cfg['profile']} replicas, "
                 f"{cfg['start_tokens']:,}-token sessions")
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
