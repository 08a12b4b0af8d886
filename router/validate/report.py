"""A validation run's report: a terminal table, a JSON document, a PNG.

Per tier: prompts compared, match rate, the first differing output position over all
its prompts (token or logprob, whichever comes first; each also given alone), the
largest |delta logprob| seen where the tokens agreed, how many prompts reported cached
tokens (the tier really exercised a cache), and the verdict. The PNG plots, per tier,
the max |delta logprob| of each prompt against its length, with the tolerance as a line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from router.validate.config import ValidateConfig
from router.validate.run import Outcome


def _pos(value: int | None) -> str:
    return "-" if value is None else str(value)


def as_json(config: ValidateConfig, outcome: Outcome) -> dict[str, Any]:
    """The run as a JSON-ready dict (every number the table shows, and per prompt)."""
    tiers: dict[str, Any] = {}
    for name, t in outcome.tiers.items():
        tiers[name] = {
            "verdict": t.verdict, "skipped": t.skipped, "prompts": len(t.comparisons),
            "matched": t.matched, "match_rate": t.match_rate, "first_diff": t.first_diff,
            "first_token_diff": t.first_token_diff,
            "first_logprob_diff": t.first_logprob_diff, "max_dlogprob": t.max_dlogprob,
            "cache_hits": t.cache_hits, "failing_lengths": t.failing_lengths,
            "per_prompt": [{"prompt_tokens": n, "ok": c.ok, "first_token_diff": c.first_token_diff,
                            "first_logprob_diff": c.first_logprob_diff,
                            "max_dlogprob": c.max_dlogprob, "near_tie": c.near_tie,
                            "cached_tokens": c.cached_tokens}
                           for n, c in zip(t.lengths, t.comparisons, strict=True)]}
    return {"ok": outcome.exit_code == 0, "exit_code": outcome.exit_code,
            "model": outcome.model, "replicas": outcome.replicas,
            "lengths": outcome.lengths, "skipped_lengths": outcome.skipped_lengths,
            "prompts_per_length": config.prompts, "max_tokens": config.max_tokens,
            "logprob_tol": config.logprob_tol, "seed": config.seed,
            "prompt_seed": outcome.prompt_seed,
            "concurrency": config.concurrency, "errors": outcome.errors, "tiers": tiers}


def summary_lines(outcome: Outcome) -> list[str]:
    """One line per failing or inconclusive tier, naming it and its first differing position."""
    out = [f"error: {e}" for e in outcome.errors]
    for name, t in outcome.tiers.items():
        if t.verdict == "FAIL":
            out.append(f"FAIL {name}: {t.matched}/{len(t.comparisons)} prompts match; first "
                       f"differing output position {t.first_diff} (token "
                       f"{_pos(t.first_token_diff)}, logprob {_pos(t.first_logprob_diff)}); "
                       f"failing prompt lengths {t.failing_lengths}")
        elif t.verdict in ("not exercised", "not cold"):
            out.append(f"{t.verdict} {name}: {t.cache_hits} of {len(t.comparisons)} prompts "
                       "reported cached tokens")
    return out


def print_table(config: ValidateConfig, outcome: Outcome) -> None:
    """The terminal table (rich when installed, plain text otherwise)."""
    head = ["tier", "prompts", "match", "first diff", "token", "logprob", "max |dlp|",
            "cached", "verdict"]
    rows = [[name, str(len(t.comparisons)),
             "-" if t.match_rate is None else f"{t.match_rate:.0%}", _pos(t.first_diff),
             _pos(t.first_token_diff), _pos(t.first_logprob_diff), f"{t.max_dlogprob:.2e}",
             "-" if t.cache_hits is None else f"{t.cache_hits}/{len(t.comparisons)}",
             t.verdict if t.skipped is None else f"skipped: {t.skipped}"]
            for name, t in outcome.tiers.items()]
    title = (f"lmroute validate: {outcome.model} on {len(outcome.replicas)} replicas, "
             f"lengths {outcome.lengths}, K={config.max_tokens}, tol={config.logprob_tol}")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        for row in [head, *rows]:
            print("  ".join(f"{c:<10}" for c in row))
    else:
        table = Table(title=title)
        for h in head:
            table.add_column(h)
        for row in rows:
            style = {"FAIL": "bold red", "pass": "green"}.get(row[-1], "yellow")
            table.add_row(*row, style=style)
        Console(width=max(120, Console().width)).print(table)
    for line in summary_lines(outcome):
        print(line)


def write_json(path: Path, config: ValidateConfig, outcome: Outcome) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(as_json(config, outcome), option=orjson.OPT_INDENT_2))


def write_png(path: Path, config: ValidateConfig, outcome: Outcome) -> None:
    """Max |delta logprob| per prompt against prompt length, one series per tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, (name, t) in enumerate(outcome.tiers.items()):
        if name == "cold" or not t.comparisons:
            continue
        ys = [max(c.max_dlogprob, 1e-9) if c.first_token_diff is None else 10.0
              for c in t.comparisons]
        xs = [n * 1.04**k for n in t.lengths]  # tiers side by side at each length
        ax.scatter(xs, ys, label=f"{name}: {t.verdict}", alpha=0.7)
    ax.axhline(config.logprob_tol, color="red", linestyle="--", label="tolerance")
    ax.set(xscale="log", yscale="log", xlabel="prompt tokens",
           ylabel="max |Δ logprob| vs cold\n(1e-9: exact; 10: token mismatch)",
           title=f"lmroute validate: {outcome.model}")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
