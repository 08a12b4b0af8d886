"""Summaries of simulated latencies: quantiles, bootstrap CIs of the median, paired differences.

- ``summary(values)``: n, mean, p50, p90, p99 (numpy's linear-interpolation quantiles) and
  the percentile-bootstrap 95 % CI of the median.
- ``bootstrap_median_ci``: ``resamples`` resamples with replacement (default 1,000),
  vectorised in blocks of rows so memory stays under ~8 M floats; the CI is the 2.5th and
  97.5th percentiles of the resampled medians. The generator is injected (seeded).
- ``paired(off, on)``: for matched measurements (same workload item under two conditions,
  e.g. the study's OFF and ON blocks) the median paired difference ``on - off`` with its
  bootstrap CI, the relative change of the medians ``100 (med(on) - med(off)) / med(off)``
  with its bootstrap CI (pairs resampled together), and the Wilcoxon signed-rank p-value
  (scipy; 1.0 when every difference is zero).
- ``group_rows(records, keys)``: flat rows, one per distinct value of ``keys``, each with the
  JSON contract's fields (``n``, ``ttft_mean_s``, ``ttft_p50_s``, ``ttft_p90_s``,
  ``ttft_p99_s``) plus ``ttft_p50_ci`` and hit fractions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

CI_LEVEL = 0.95
_BLOCK_FLOATS = 8_000_000


def bootstrap_median_ci(values: Sequence[float] | np.ndarray, rng: np.random.Generator,
                        resamples: int = 1000) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return (float("nan"), float("nan"))
    if x.size == 1:
        return (float(x[0]), float(x[0]))
    meds = np.empty(resamples)
    rows = max(1, _BLOCK_FLOATS // x.size)
    for start in range(0, resamples, rows):
        k = min(rows, resamples - start)
        meds[start : start + k] = np.median(x[rng.integers(0, x.size, (k, x.size))], axis=1)
    tail = (1 - CI_LEVEL) / 2 * 100
    lo, hi = np.percentile(meds, [tail, 100 - tail])
    return (float(lo), float(hi))


def summary(values: Sequence[float], rng: np.random.Generator, prefix: str = "ttft") -> dict[str, Any]:
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return {"n": 0}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    lo, hi = bootstrap_median_ci(x, rng)
    return {
        "n": int(x.size),
        f"{prefix}_mean_s": float(x.mean()),
        f"{prefix}_p50_s": float(p50),
        f"{prefix}_p90_s": float(p90),
        f"{prefix}_p99_s": float(p99),
        f"{prefix}_p50_ci": [lo, hi],
    }


def paired(off: Sequence[float], on: Sequence[float], rng: np.random.Generator,
           resamples: int = 1000) -> dict[str, Any]:
    a = np.asarray(off, dtype=float)
    b = np.asarray(on, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("paired samples need equal, non-zero lengths")
    diff = b - a
    idx = rng.integers(0, a.size, (resamples, a.size))
    med_a = np.median(a[idx], axis=1)
    med_b = np.median(b[idx], axis=1)
    change = 100 * (med_b - med_a) / med_a
    tail = (1 - CI_LEVEL) / 2 * 100
    p = 1.0 if not np.any(diff) else float(sps.wilcoxon(b, a).pvalue)
    return {
        "n": int(a.size),
        "median_off": float(np.median(a)),
        "median_on": float(np.median(b)),
        "median_diff_s": float(np.median(diff)),
        "median_diff_ci": [float(v) for v in np.percentile(np.median(diff[idx], axis=1),
                                                           [tail, 100 - tail])],
        "change_pct": float(100 * (np.median(b) - np.median(a)) / np.median(a)),
        "change_pct_ci": [float(v) for v in np.percentile(change, [tail, 100 - tail])],
        "wilcoxon_p": p,
    }


def group_rows(records: Iterable[Any], keys: Sequence[str], rng: np.random.Generator,
               value: Callable[[Any], float] = lambda r: r.ttft_s,
               extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One flat row per distinct ``keys`` tuple, in first-seen order."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for r in records:
        groups.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
    rows = []
    for key, recs in groups.items():
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row.update(extra or {})
        row.update(summary([value(r) for r in recs], rng))
        tokens = sum(r.prompt_tokens for r in recs)
        row["gpu_hit_frac"] = sum(r.gpu_hit_tokens for r in recs) / tokens
        row["pool_hit_frac"] = sum(r.pool_hit_tokens for r in recs) / tokens
        rows.append(row)
    return rows
