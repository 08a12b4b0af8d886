"""Build hook: with ``LMROUTE_MYPYC=1``, the router's request path and the locality
policy's modules are compiled to C extensions by mypyc (mypy's compiler, as black and mypy
itself ship); otherwise the package is pure Python, as pyproject.toml describes it.

The compiled modules run the same source, typed as mypy checks it: in process the
policy's hooks cost about half as much, and under load a request costs the router about
10 % less CPU (docs/benchmarks.md, "`locality` compiled by mypyc" and "The request path
compiled"). The
build needs mypy and a C compiler in the build environment, so it is opt-in and runs
without build isolation::

    pip install 'setuptools>=77' wheel 'mypy>=1.10'
    pip install --no-build-isolation .      # the dependencies first: mypyc type-checks
    LMROUTE_MYPYC=1 pip install --no-build-isolation --no-deps --force-reinstall .

(``make fast`` builds ``.venv-fast`` so.) An editable install stays pure: a compiled
module next to its source would shadow every later edit of it.
"""

from __future__ import annotations

import os

from setuptools import setup

# The modules of one routing decision with ``locality`` (its hooks' call graph); the
# other policies' stay pure Python (mypyc rejects ``policies.base``'s runtime-checkable
# Protocol, so the views it re-exports are a module of their own).
COMPILED = [
    "policies/views.py",
    "policies/locality.py",
    "policies/calibration.py",
    "policies/cost.py",
    "policies/fifo_queue.py",
    "policies/session_log.py",
    "policies/returning.py",
    "policies/new_prefixes.py",
    "policies/dispatch_rate.py",
    "policies/hashing.py",
    "policies/copy_benefit.py",
    "policies/copy_log.py",
    # The router's request path. Not compiled: modules with async generators (mypyc
    # does not implement them: body_chunks, which holds the replica hop's one, so that
    # wire and upstream compile; passthrough, upload, app), the exception
    # tree (errors: mypyc's exception classes lose their class-level defaults), the
    # settings (read by introspecting their annotations), router.index's package and
    # protocol (runtime_checkable), compiled (the shims Starlette inspects) and the
    # control plane, which runs off the request path.
    "router/bodies.py",
    "router/disconnect.py",
    "router/drain.py",
    "router/failures.py",
    "router/forward.py",
    "router/gate.py",
    "router/headers.py",
    "router/hotpath.py",
    "router/ids.py",
    "router/in_flight.py",
    "router/index/memory.py",
    "router/index/resilient.py",
    "router/jsonbody.py",
    "router/locator.py",
    "router/logs.py",
    "router/metrics.py",
    "router/models.py",
    "router/openai_api.py",
    "router/pin.py",
    "router/prefix.py",
    "router/proxy.py",
    "router/relay.py",
    "router/replicas.py",
    "router/response_ids.py",
    "router/routes.py",
    "router/shapes.py",
    "router/tallies.py",
    "router/tenants.py",
    "router/upstream.py",
    "router/usage.py",
    "router/wire.py",
    "router/wire_pool.py",
]

if os.environ.get("LMROUTE_MYPYC") == "1":
    from mypyc.build import mypycify

    setup(ext_modules=mypycify(COMPILED, opt_level="3"))
else:
    setup()
