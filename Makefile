# ragrank: `make demo` runs the main job, `make test` runs the tests. Both set up what is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Where a CPU-only machine gets torch when no local wheel is found (avoids GBs of CUDA packages).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.DEFAULT_GOAL := help
.PHONY: help setup demo serve test test-slow lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

setup: $(VENV)/.installed ## create .venv with torch (CPU build unless a GPU is present) and ragrank

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
	  echo "torch: already installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
	  echo "torch: GPU found, installing the CUDA build"; \
	  $(BIN)/pip install "torch==$(TORCH_VERSION)"; \
	elif $(BIN)/pip install --no-index --no-deps "torch==$(TORCH_VERSION)" 2>/dev/null; then \
	  echo "torch: installed the local CPU wheel"; $(BIN)/pip install "torch==$(TORCH_VERSION)"; \
	else \
	  echo "torch: no GPU, installing the CPU build"; \
	  $(BIN)/pip install "torch==$(TORCH_VERSION)" --index-url $(TORCH_CPU_INDEX) \
	    --extra-index-url https://pypi.org/simple; \
	fi
	$(BIN)/pip install -e '.[dev]'
	touch $@

demo: setup ## index the bundled sample, show cosine vs reranked order, serve on :8000
	$(BIN)/ragrank demo

serve: setup ## serve the API with the configured models and store
	$(BIN)/ragrank serve

test: setup ## run the test suite (tiny models, no network)
	$(BIN)/pytest -m "not slow"

test-slow: setup ## run the real-model and real-data tests too
	$(BIN)/pytest

lint: setup ## ruff and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean: ## remove the virtualenv, caches and local data
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache ragrank-data *.egg-info
