"""Time to first token by what the engine was doing: the vLLM pair's requests, one by one.

``bench/vllm_policies.py`` keeps, per run, every request the router served as its access
log line says it (``per_request``: the replica, the decision's reason, the time to first
body bytes and the total, and the end time, to the millisecond). From these the state
of the chosen engine when each request arrived is rebuilt: ``prefilling``, the router's
requests on that engine still before their first token, and ``decoding``, those past it
and not finished (all of the engine's work on the pair: one router, one client). vLLM runs
a new prompt's prefill in the same engine steps as the running sequences' decodes, so
both delay it; the policies' cost model sees the first (its queue) and not the second.

Printed per policy: the share of requests that arrived at an engine with nothing of
ours in flight, the mean count of requests prefilling and decoding there at arrival (the
queue each arrival found), the mean TTFT by (reason kind, prefilling, decoding) cell, and a least-
squares fit over the cache hits::

    ttft = base + per_prefilling * prefilling + any_decoding * [decoding > 0]
           + per_decoding * decoding

(the first decoding sequence costs a step's wait, later ones their share of the step).
With ``--plot``: the share of arrivals that found the engine idle, decoding only, or
prefilling, per policy; and per policy the mean TTFT of hits against sequences decoding,
one line per prefilling count (cells of at least 5 requests).

    .venv/bin/python bench/pair_states.py docs/vllm-pinned-states-r8-570.json [--plot P]
        [--skip-seeds N ...]

Only requests on a generating route count (``GENERATING``; recorded since the
thirty-second session, so earlier runs' records hold the client's ``/tokenize`` calls too:
one a set, 0.4 % of the records, but all 241 of run 640's set 643).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

# A served reply's access line (``router.logs``, plain format).
_ACCESS = re.compile(
    r"^(\S+) INFO lmroute\.access: POST (\S+) 200 .* replica=(\S+) reason=(\S+) "
    r"ttft_s=(\S+) total_s=(\S+)")
# The routes whose requests the engine prefills and decodes. vLLM's benchmark client also
# POSTs ``/tokenize`` through the router (one a set, and in one set of run 640 all 241
# after the client's start): served in milliseconds on the same engines, they are no
# arrivals of the workload and made each set's requests overlap them.
GENERATING = ("/v1/completions", "/v1/chat/completions")
CAP = 3  # cells past this many prefilling (decoding: 2 * CAP) are pooled


def requests_from_log(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Every served POST in a router's access log: path, replica, reason, ttft_s,
    total_s and ``end`` (seconds since the epoch, to the millisecond)."""
    out = []
    for line in lines:
        m = _ACCESS.match(line)
        if m is None:
            continue
        end = datetime.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.UTC).timestamp()
        out.append({"path": m[2].split("?", 1)[0], "replica": m[3], "reason": m[4],
                    "ttft_s": float(m[5]), "total_s": float(m[6]), "end": round(end, 3)})
    return out


def generating(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests on a ``GENERATING`` route; a record without its path (runs before the
    path was recorded, up to run 640) is kept, as nothing tells what it was."""
    return [r for r in requests if r.get("path", GENERATING[0]) in GENERATING]


def with_states(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each request with ``prefilling`` and ``decoding``: the others on its replica, at its
    arrival, before and past their first token."""
    spans = [(r["end"] - r["total_s"], r["end"] - r["total_s"] + r["ttft_s"], r["end"], r)
             for r in requests]
    out = []
    for start, _, _, r in spans:
        pre = dec = 0
        for s, first, end, o in spans:
            if o is r or o["replica"] != r["replica"] or not s < start < end:
                continue
            if first > start:
                pre += 1
            else:
                dec += 1
        out.append({**r, "prefilling": pre, "decoding": dec})
    return out


def kind(reason: str) -> str:
    return "hit" if reason.endswith("hit") else reason


def warm(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The requests a fit of hits reads: the cache hits where the policy's reasons say
    which are hits (``gpu-hit``, ``pool-hit``), else every request it did not give as a
    miss (``least_loaded``, ``round_robin``, ``load_aware``'s ``score``); and whether they
    are hits only."""
    hits = [r for r in rows if kind(r["reason"]) == "hit"]
    if hits:
        return hits, True
    return [r for r in rows if r["reason"] != "miss"], False


def fit(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Least squares of a hit's TTFT on its engine's state (the module docstring)."""
    if len(rows) < 8:
        return None
    x = np.array([[1.0, r["prefilling"], float(r["decoding"] > 0), r["decoding"]]
                  for r in rows])
    y = np.array([r["ttft_s"] for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return dict(zip(("base", "per_prefilling", "any_decoding", "per_decoding"),
                    (float(c) for c in coef), strict=True))


def by_policy(doc: dict[str, Any], skip_seeds: Iterable[int] = ()
              ) -> dict[str, list[dict[str, Any]]]:
    """Each policy's requests with their states, set by set, the sets of ``skip_seeds``
    left out."""
    skip = set(skip_seeds)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in doc["runs"]:
        if run.get("per_request") and run.get("seed") not in skip:
            out[run["policy"]] += with_states(generating(run["per_request"]))
    return dict(out)


def report(policies: dict[str, list[dict[str, Any]]]) -> str:
    lines = []
    for policy, rows in sorted(policies.items()):
        idle = sum(1 for r in rows if r["prefilling"] == 0 and r["decoding"] == 0)
        lines += [f"## {policy}: {len(rows)} requests, mean TTFT "
                  f"{1e3 * np.mean([r['ttft_s'] for r in rows]):.1f} ms; "
                  f"{idle / len(rows):.0%} arrived at an engine with nothing of ours in flight",
                  "", f"reasons: {dict(Counter(r['reason'] for r in rows))}", "",
                  "at arrival, on average: "
                  f"{np.mean([r['prefilling'] for r in rows]):.2f} prefilling, "
                  f"{np.mean([r['decoding'] for r in rows]):.2f} decoding", ""]
        hits, only_hits = warm(rows)
        f = fit(hits)
        if f is not None:
            lines += ["fit over " + ("hits" if only_hits else "every request but misses")
                      + ": " + ", ".join(
                f"{k} {1e3 * v:.1f} ms" for k, v in f.items()), ""]
        cells: dict[tuple[str, int, int], list[float]] = defaultdict(list)
        for r in rows:
            cells[(kind(r["reason"]), min(r["prefilling"], CAP),
                   min(r["decoding"], 2 * CAP))].append(r["ttft_s"])
        lines += ["| kind | prefilling | decoding | requests | mean TTFT (ms) | median |",
                  "|---|---|---|---|---|---|"]
        for (k, p, d), v in sorted(cells.items()):
            lines.append(f"| {k} | {p}{'+' if p == CAP else ''} | {d}{'+' if d == 2 * CAP else ''}"
                         f" | {len(v)} | {1e3 * np.mean(v):.1f} | {1e3 * np.median(v):.1f} |")
        lines.append("")
    return "\n".join(lines)


def plot(policies: dict[str, list[dict[str, Any]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(policies)
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(3.2 * (len(names) + 1), 3.4),
                             squeeze=False)
    share = axes[0][0]
    groups = (("nothing in flight", lambda r: r["prefilling"] == 0 and r["decoding"] == 0),
              ("decoding only", lambda r: r["prefilling"] == 0 and r["decoding"] > 0),
              ("prefilling", lambda r: r["prefilling"] > 0))
    bottom = np.zeros(len(names))
    for label, test in groups:
        part = np.array([np.mean([test(r) for r in policies[p]]) for p in names])
        share.bar(range(len(names)), part, bottom=bottom, label=label)
        bottom += part
    share.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=7)
    share.set_title("the engine at each arrival", fontsize=8)
    share.set_ylabel("share of requests")
    share.legend(fontsize=7)
    for ax, policy in zip(axes[0][1:], names, strict=True):
        rows = warm(policies[policy])[0]
        for pre in range(CAP):
            xs, ys = [], []
            for dec in range(2 * CAP):
                v = [r["ttft_s"] for r in rows
                     if r["prefilling"] == pre and min(r["decoding"], 2 * CAP - 1) == dec]
                if len(v) >= 5:
                    xs.append(dec)
                    ys.append(1e3 * float(np.mean(v)))
            if xs:
                ax.plot(xs, ys, marker="o", label=f"{pre} prefilling")
        ax.set_title(policy, fontsize=8)
        ax.set_xlabel("sequences decoding on the engine")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("mean TTFT of a hit (ms)" if ax is axes[0][1] else "")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="a bench/vllm_policies.py result with per-request records")
    ap.add_argument("--plot", default=None)
    ap.add_argument("--skip-seeds", type=int, nargs="+", default=[],
                    help="leave these sets out (run 640's set 643: its records, made before "
                         "each record's path was kept, hold the client's /tokenize calls)")
    args = ap.parse_args()
    with open(args.json) as fh:
        policies = by_policy(json.load(fh), args.skip_seeds)
    if not policies:
        raise SystemExit(f"{args.json}: no run has per-request records (`per_request`)")
    print(report(policies))
    if args.plot:
        plot(policies, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
