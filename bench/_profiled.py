"""``python bench/_profiled.py OUT ARGS...``: ``lmroute ARGS...`` under cProfile, its stats
written to OUT when the process exits normally (``bench/request_calls.py``)."""

from __future__ import annotations

import atexit
import cProfile
import runpy
import sys

out = sys.argv[1]
profiler = cProfile.Profile()


def _write() -> None:
    profiler.disable()
    profiler.dump_stats(out)


atexit.register(_write)
sys.argv = ["lmroute", *sys.argv[2:]]
profiler.enable()
runpy.run_module("router.cli", run_name="__main__")
