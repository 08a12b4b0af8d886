# vLLM 0.32.0 (the version lmroute's end-to-end tests run) with LMCache 0.5.6 as its KV
# connector: the image of docker-compose.yml's vllm-a, vllm-b and lmcache-server.
#
#   docker build -f deploy/vllm-lmcache.Dockerfile -t lmroute-vllm:0.32.0-lmcache0.5.6 deploy
#
# vLLM's official image keeps its Python in the venv /opt/venv (on its PATH); LMCache goes
# into the same venv, so its server is /opt/venv/bin/lmcache_server. The build fails if it
# lands anywhere else, rather than the compose file starting a name that is not there.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}
ARG LMCACHE_VERSION=0.5.6
RUN python3 -m pip install --no-cache-dir "lmcache==${LMCACHE_VERSION}" \
 && test -x /opt/venv/bin/lmcache_server \
 && python3 -c "import vllm, lmcache; assert vllm.__version__.startswith('0.32.'), vllm.__version__"
