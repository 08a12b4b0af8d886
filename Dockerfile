# The lmroute router image: the router alone (no simulator extras), as a non-root user,
# `lmroute serve` as the entrypoint, configured by LMROUTE_* variables (router/settings.py:
# every `serve` option is LMROUTE_<OPTION>, lists comma-separated).
#
#   docker build -t lmroute:0.1.0 .
#   docker run --rm -p 8080:8080 -e LMROUTE_BACKENDS=http://vllm-a:8000,http://vllm-b:8000 \
#     lmroute:0.1.0
#
# Build arguments:
#   BASE          the base image; any Debian-like image with python3 >= 3.11 and its venv
#                 module (default: the slim official Python image). Machines without a
#                 registry build one with deploy/base-image.sh and pass it here.
#   PIP_NO_INDEX, PIP_FIND_LINKS   pip's own variables, for offline builds from a wheel
#                 directory inside the context (deploy/wheels.sh fills .wheels/).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Only the package's sources (.dockerignore keeps tests, docs and any .venv out). sim/
# comes along because the wheel holds it; `lmroute replica` runs on the router's own
# dependencies, the rest of sim/ is unusable without the sim extra and stays unused.
COPY pyproject.toml README.md /src/
COPY router /src/router
COPY policies /src/policies
COPY sim /src/sim
# .wheels/ holds wheels for offline builds (deploy/wheels.sh); README.md keeps the glob
# from matching nothing when it is absent.
COPY README.md .wheel[s] /wheels/
RUN python3 -m venv /opt/lmroute \
 && /opt/lmroute/bin/pip install /src \
 && /opt/lmroute/bin/pip uninstall -y pip \
 && /opt/lmroute/bin/lmroute serve --help >/dev/null

# The venv keeps the bytecode pip compiled at install: the non-root user could not write
# it, and a start without it compiles every module (seconds).
FROM ${BASE}
COPY --from=build /opt/lmroute /opt/lmroute
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin lmroute
USER 10001:10001
ENV PATH=/opt/lmroute/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LMROUTE_HOST=0.0.0.0 \
    LMROUTE_PORT=8080 \
    LMROUTE_LOG_LEVEL=info
EXPOSE 8080
ENTRYPOINT ["lmroute", "serve"]
