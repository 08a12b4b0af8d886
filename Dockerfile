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
#   BUILD_BASE    the build stage's image: BASE's Python plus a C compiler and the Python
#                 headers (default: the full official Python image, which has both). The
#                 venv it builds is copied into BASE, so both must carry the same Python.
#                 deploy/base-image.sh builds one beside its base.
#   COMPILED      1 (default): the request path and the locality policy compiled by mypyc,
#                 as `make fast` (setup.py; 1.2-1.3x the non-streamed requests a CPU-second
#                 of the pure build for `locality`, docs/benchmarks.md); 0: pure Python,
#                 for a BUILD_BASE without a compiler.
#   PIP_NO_INDEX, PIP_FIND_LINKS   pip's own variables, for offline builds from a wheel
#                 directory inside the context (deploy/wheels.sh fills .wheels/).
ARG BASE=python:3.11-slim
ARG BUILD_BASE=python:3.11

FROM ${BUILD_BASE} AS build
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
ARG COMPILED=1
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Only the package's sources (.dockerignore keeps tests, docs and any .venv out). sim/
# comes along because the wheel holds it; `lmroute replica` runs on the router's own
# dependencies, the rest of sim/ is unusable without the sim extra and stays unused.
COPY pyproject.toml setup.py README.md /src/
COPY deploy/compile.sh /src/deploy/compile.sh
COPY router /src/router
COPY policies /src/policies
COPY sim /src/sim
# .wheels/ holds wheels for offline builds (deploy/wheels.sh); README.md keeps the glob
# from matching nothing when it is absent.
COPY README.md .wheel[s] /wheels/
# The compiled build as `make fast` makes it (deploy/compile.sh); the compiler's own
# packages and the shared libraries' debug symbols stay out of the image.
RUN python3 -m venv /opt/lmroute \
 && if [ "$COMPILED" = 1 ]; then \
      /src/deploy/compile.sh /opt/lmroute/bin/python /src \
      && /opt/lmroute/bin/pip uninstall -y mypy librt ast-serialize pathspec mypy_extensions \
           wheel \
      && SP=$(/opt/lmroute/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))") \
      && strip --strip-unneeded "$SP"/*__mypyc*.so "$SP"/router/*.so "$SP"/policies/*.so; \
    else \
      /opt/lmroute/bin/pip install /src ; \
    fi \
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
