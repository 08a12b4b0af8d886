# lmroute: `make demo` and `make test` each install what they need, then run.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint bench clean

# The venv is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/lmroute demo --json out/demo.json --plot out/demo.png

test: $(STAMP)
	$(BIN)/ruff check router policies sim tests bench
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check router policies sim tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/router_bench.py

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache *.egg-info
