"""Print a short table of bench/gpu JSON results: ``python3 summary.py FILE.json ...``."""

from __future__ import annotations

import json
import sys


def line(r: dict) -> str:
    if r.get("kind") == "copy":
        return (f"copy {r['direction']} {r['mode']:9} {r['pin']:8} ov={int(r['overlap'])} "
                f"prio={r.get('priority', 'normal'):6} "
                f"chunk={r['chunk']:5} bpt={r['bpt'] // 1024}K tok={r['tokens']:7} "
                f"{r['ms']:9.2f} ms {r['gbps']:7.2f} GB/s bad={r['bad_bytes']}")
    if r.get("kind") == "prefill":
        return (f"prefill {r['stack']:6} cached={r['cached']:7} new={r['new']:7} "
                f"{r['ms']:10.1f} ms {r['tflops']:6.1f} TFLOP/s")
    if r.get("kind") == "decode":
        return f"decode b={r['batch']:3} ctx={r['context']:7} {r['ms']:8.3f} ms eager={r['eager_ms']}"
    if r.get("kind") == "chunked_prefill":
        return f"chunked prefill {r['new']:7} in {r['chunk']}-token steps {r['ms']:10.1f} ms"
    return json.dumps(r)[:200]


for path in sys.argv[1:]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        print(path, "unreadable:", exc)
        continue
    print(path, "complete" if doc.get("complete") else "INCOMPLETE",
          {k: v for k, v in doc["meta"].items() if k not in ("env", "shape")})
    for r in doc["results"]:
        print(line(r))
