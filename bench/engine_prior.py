"""A ``locality`` prior fitted to an engine's own prefill times (``engine_batching.py --alone``).

``locality``'s cost model predicts a prefill of ``new`` tokens after ``cached`` ones as

    prefill_fixed_s + prefill_token_s * new + prefill_token2_s * (total**2 - cached**2)

(``policies.cost``). ``bench/engine_batching.py --alone`` times prompts with nothing cached,
sent alone to one engine, at several lengths; for those ``cached`` is 0 and the model is a
quadratic in the prompt's length. This fits its three coefficients by non-negative least
squares (``scipy.optimize.nnls``: a negative term is no cost) to every timed prompt and
writes them as a prior file (``locality@prior=FILE``). The pool-load terms are not
measured here: they come from ``--base`` (a built-in prior), as ``policies.cost.load_prior``
reads any key a file leaves out.

    .venv/bin/python bench/engine_prior.py docs/engine-prefill-alone.json \\
        --out docs/engine-prior-cpu-epyc.toml

Prints the fit and each length's measured and fitted times.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from policies.cost import load_prior


def alone_points(doc: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, seconds) of every prompt an ``--alone`` run timed."""
    rows = [b for b in doc["bursts"] if b["kind"] == "alone"]
    if len(rows) < 3:
        raise SystemExit("needs at least 3 timed prompts of an engine_batching.py --alone run")
    tokens = np.array([float(b["tokens"]) for b in rows])
    seconds = np.array([b["ttft_ms"][0] / 1000 for b in rows])
    return tokens, seconds


def fit(tokens: np.ndarray, seconds: np.ndarray) -> tuple[float, float, float]:
    """(fixed s, s per token, s per token squared), each >= 0, least squares."""
    design = np.stack([np.ones_like(tokens), tokens, tokens * tokens], axis=1)
    coef, _ = nnls(design, seconds)
    return float(coef[0]), float(coef[1]), float(coef[2])


def prior_text(name: str, base: str, source: str, coef: tuple[float, float, float],
               cpu: Any) -> str:
    """The prior file: the fitted prefill keys, the rest from ``base``."""
    fixed, token, token2 = coef
    return (f"# Fitted by bench/engine_prior.py to {source} (prompts sent alone, nothing\n"
            f"# cached; CPU {json.dumps(cpu)}). Pool-load keys come from {base!r}.\n"
            f'name = "{name}"\nbase = "{base}"\n'
            f"prefill_fixed_s = {fixed:.6g}\nprefill_token_s = {token:.6g}\n"
            f"prefill_token2_s = {token2:.6g}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", type=Path, help="an engine_batching.py --alone --json file")
    ap.add_argument("--out", type=Path, required=True, help="the prior file to write (.toml)")
    ap.add_argument("--base", default="study-27b", help="built-in prior for the other keys")
    args = ap.parse_args()
    doc = json.loads(args.result.read_text())
    tokens, seconds = alone_points(doc)
    coef = fit(tokens, seconds)
    args.out.write_text(prior_text(args.out.stem, args.base, str(args.result), coef,
                                   doc.get("cpu")))
    print(f"fixed {coef[0]:.4g} s, per token {coef[1]:.4g} s, per token^2 {coef[2]:.4g} s")
    prior = load_prior(args.out)  # the file as locality reads it, and its own prefill model
    for n in sorted(set(int(t) for t in tokens)):
        at = np.abs(tokens - n) < 0.5
        model = prior.prefill_s(0, n)
        print(f"{n:6d} tokens: measured {seconds[at].mean():.3f} s, fitted {model:.3f} s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
