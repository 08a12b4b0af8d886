"""The experiments' report kit: JSON documents, markdown tables, matplotlib figures, progress.

- ``write_json(doc, path)``: the document, indented, written atomically (a temporary file
  then ``os.replace``: a run interrupted mid-write, e.g. a resumable A/B run, still leaves
  the previous document) into a directory created if missing. Standard ``json``: NaN is
  written as ``NaN``, as Python reads it back.
- ``table(rows, columns)``: a markdown table; floats to 3 decimals (3 significant digits
  from 1e5 up), lists bracketed. ``fmt`` formats one cell (NaN as ``n/a``).
- ``figure(path, ...)``: a context manager yielding ``(fig, axes)`` from
  ``plt.subplots`` on the Agg backend (no display); on exit the figure is laid out, saved
  at 110 dpi into a directory created if missing, and closed. ``plain_log_axis`` puts
  plain numbers ("2.6", not "2.6 x 10^0") on a log axis.
- ``progress_bar(what)``: a rich progress bar on stderr (tables go to stdout), transient;
  it is a ``Progress`` (``start(total, what)``, ``advance(label)``) for the simulator and
  ``tick()`` advances it by one for the live experiments.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def write_json(doc: Any, path: str | Path) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def fmt(v: Any, digits: int = 3) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x, digits) for x in v) + "]"
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.{digits}f}" if abs(v) < 1e5 else f"{v:.3g}"
    return str(v)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def figure(path: str | Path, ncols: int = 1, figsize: tuple[float, float] = (8, 4.8),
           **subplots: Any) -> Iterator[tuple[Any, Any]]:
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def plain_log_axis(axis: Any, minor: str | None = None) -> None:
    import matplotlib.ticker

    axis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter(minor) if minor
                             else matplotlib.ticker.NullFormatter())


class ProgressBar:
    """A rich progress bar on stderr; see the module docstring."""

    def __init__(self, what: str = "") -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                             console=Console(stderr=True), transient=True)
        self._what = what
        self._task: Any = None

    def start(self, total: int, what: str = "", completed: int = 0) -> None:
        self._task = self._bar.add_task(what or self._what, total=total, last="",
                                        completed=completed)

    def advance(self, label: str = "") -> None:
        self._bar.update(self._task, advance=1, last=label)

    def tick(self) -> None:
        self.advance()


@contextlib.contextmanager
def progress_bar(what: str = "", total: int | None = None,
                 completed: int = 0) -> Iterator[ProgressBar]:
    """A started ``ProgressBar``; with ``total`` its task is already added."""
    bar = ProgressBar(what)
    with bar._bar:
        if total is not None:
            bar.start(total, what, completed)
        yield bar
