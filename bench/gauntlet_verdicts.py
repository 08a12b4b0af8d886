"""The robust-locality issue's bars, checked against a gauntlet result (``lmroute sim gauntlet``).

Run: ``.venv/bin/python bench/gauntlet_verdicts.py docs/gauntlet.json``. Prints, per bar,
how many cells pass and lists every cell that does not (markdown):

1. up to saturation (load multiple <= 1): locality / best other policy, mean and p90
   TTFT, upper end of the 95 % CI under 1.05 (CI-aware) — and the point estimate <= 1.02;
2. past saturation (load multiple > 1): the point estimate never above 1.10;
3. capacity at the SLO (the highest knee multiple with p90 within it) at least the best
   other policy's, per cell;
4. wins: cells where locality is at least 20 % better (ratio <= 0.80) on mean and p90.

"Best other" is chosen per cell and load after the fact (the lowest across-seed mean of
every other policy), which favours the baselines.

``--target P`` judges a variant of ``locality`` instead (``locality@OPTIONS``), against
the baselines only, and ``--with DOC ...`` adds the raw rows of other gauntlet runs of the
same matrix first: a variant run alone with the same knees and seeds joins the baselines
of a committed run (the simulations pair by seed; rows of different knees never pair).

    .venv/bin/python bench/gauntlet_verdicts.py docs/gauntlet-8seeds-full.json \
        --with out/gauntlet-arm.json --target "locality@tie_work=false"
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sim.experiments import gauntlet_report
from sim.experiments.gauntlet import is_locality


def _fmt(r: dict[str, Any], m: str) -> str:
    lo, hi = r[f"ratio_{m}_ci"]
    return f"{r[f'ratio_{m}']:.2f} [{lo:.2f}, {hi:.2f}] vs {r[f'best_other_{m}']}"


def retarget(doc: dict[str, Any], target: str, others: list[dict[str, Any]]
             ) -> dict[str, Any]:
    """``doc`` with the raw rows of ``others`` added, its ratios and capacities those of
    ``target`` against the baselines."""
    raw = [r for d in (doc, *others) for r in d["raw"]]
    knees = {**doc["knees"], **{k: v for d in others for k, v in d["knees"].items()
                                if k not in doc["knees"]}}
    rows = gauntlet_report.aggregate_rows(raw)
    return {**doc, "raw": raw, "rows": rows, "target": target,
            "ratios": gauntlet_report.ratios(raw, target),
            "capacity": gauntlet_report.capacity(rows, knees)}


def verdicts(doc: dict[str, Any]) -> list[str]:
    target = doc.get("target", "locality")
    ratios = doc["ratios"]
    out: list[str] = []
    under = [r for r in ratios if r["load"] <= 1.0]
    fail1 = [r for r in under for m in ("mean", "p90")
             if r[f"ratio_{m}"] > 1.02 or r[f"ratio_{m}_ci"][1] >= 1.05]
    strict = [r for r in under for m in ("mean", "p90") if r[f"ratio_{m}"] > 1.02]
    out.append(f"## 1. Up to saturation: {2 * len(under) - len(fail1)} of {2 * len(under)} "
               f"(cell, metric) pass both; {2 * len(under) - len(strict)} pass on the point "
               "estimate (<= 1.02)")
    # every cell failing either test, the point estimate's failures first
    on_point = {id(r) for r in strict}
    failing = {id(r): r for r in strict + fail1}.values()
    out += [f"- {r['cell']} load {r['load']:g}: mean {_fmt(r, 'mean')}; p90 {_fmt(r, 'p90')}"
            + ("" if id(r) in on_point else " (CI only)") for r in failing]
    over = [r for r in ratios if r["load"] > 1.0]
    fail2 = [r for r in over if max(r["ratio_mean"], r["ratio_p90"]) > 1.10]
    out.append(f"## 2. Past saturation: {len(over) - len(fail2)} of {len(over)} cells within 1.10x")
    out += [f"- {r['cell']} load {r['load']:g}: mean {_fmt(r, 'mean')}; p90 {_fmt(r, 'p90')}"
            for r in fail2]
    cells: dict[str, dict[str, float | None]] = {}
    for c in doc["capacity"]:
        cells.setdefault(c["cell"], {})[c["policy"]] = c["capacity"]
    fail3 = []
    for cell, caps in cells.items():
        mine = caps.get(target)
        others = [v for p, v in caps.items() if not is_locality(p) and v is not None]
        if mine is not None and others and mine < max(others):
            fail3.append(f"- {cell}: {target} {mine:g}, best other {max(others):g}")
    out.append(f"## 3. Capacity: {len(cells) - len(fail3)} of {len(cells)} cells "
               "at least the best other's")
    out += fail3
    wins = [r for r in ratios if r["ratio_mean"] <= 0.80 and r["ratio_p90"] <= 0.80]
    out.append(f"## 4. At least 20 % better on mean and p90: {len(wins)} (cell, load) points")
    out += [f"- {r['cell']} load {r['load']:g}: mean {r['ratio_mean']:.2f}, p90 {r['ratio_p90']:.2f}"
            for r in wins]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="a gauntlet JSON document")
    ap.add_argument("--target", default="locality",
                    help="the policy judged (a locality variant, as named in the run)")
    ap.add_argument("--with", dest="others", nargs="+", default=[], metavar="DOC",
                    help="gauntlet documents of the same matrix whose raw rows are added")
    ap.add_argument("--plot", default=None,
                    help="also write the heat map of the judged policy's ratios (PNG)")
    args = ap.parse_args()
    with open(args.result) as fh:
        doc = json.load(fh)
    if args.others or args.target != "locality":
        others = []
        for path in args.others:
            with open(path) as fh:
                others.append(json.load(fh))
        doc = retarget(doc, args.target, others)
    print("\n".join(verdicts(doc)))
    if args.plot:
        gauntlet_report.heatmap(doc, args.plot)


if __name__ == "__main__":
    main()
