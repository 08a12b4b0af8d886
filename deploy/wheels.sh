#!/usr/bin/env bash
# Fill .wheels/ with every wheel the router image installs (lmroute's dependencies plus
# the build backend and mypy, which compiles the request path in the image's build stage),
# from this machine's pip configuration, so `docker build` with
# --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/wheels needs no network.
#
#   deploy/wheels.sh [PYTHON]     default PYTHON: .venv/bin/python (the `make install` venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
mkdir -p .wheels
# async-timeout: redis needs it on Python < 3.11.3 (Debian bookworm's python3 is 3.11.2);
# resolved here for this machine's Python, it must be named.
"$PY" -m pip wheel --quiet --wheel-dir .wheels . 'setuptools>=77' wheel 'mypy>=1.10' 'async-timeout>=4.0.3' 
rm -f .wheels/lmroute-*.whl  # the image builds lmroute from its sources
