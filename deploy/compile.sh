#!/usr/bin/env bash
# Install lmroute from SRC into PYTHON's venv with its request path and `locality` policy
# compiled by mypyc (setup.py, LMROUTE_MYPYC=1): the pure install first, because mypyc
# type-checks the request path against its dependencies (fastapi, starlette,
# prometheus_client), which must be there before the build; then the compiled one over
# it; then a check that the hot modules are C extensions. `make fast` and the router
# image's build stage (Dockerfile) both install this way. Needs a C compiler and the
# Python headers.
#
#   deploy/compile.sh PYTHON SRC
set -euo pipefail
PY=$1
SRC=$2
"$PY" -m pip install --quiet 'setuptools>=77' wheel 'mypy>=1.10'
"$PY" -m pip install --quiet --no-build-isolation "$SRC"
LMROUTE_MYPYC=1 "$PY" -m pip install --quiet --no-build-isolation --force-reinstall --no-deps "$SRC"
# From /: the sources in the working directory would shadow the installed modules.
cd / && "$PY" -c "import policies.locality as m, router.proxy as p; \
assert m.__file__.endswith('.so') and p.__file__.endswith('.so'), (m.__file__, p.__file__)"
