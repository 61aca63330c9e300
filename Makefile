# ragrank: `make demo` runs the main job, `make test` runs the tests. Both set up what is missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CLIENTS_VENV ?= .venv-clients
# Lint's own environment: every dependency but torch, which no check needs (mypy reads torch as
# untyped, see pyproject.toml).
LINT_VENV ?= .venv-lint
TORCH_VERSION ?= 2.13.0
# Where a CPU-only machine gets torch when no local wheel is found (avoids GBs of CUDA packages).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

# Where nvidia-smi lists a GPU, setup installs the CUDA builds of torch and faiss. The eval's
# faiss is one of the `eval` (CPU) and `gpu` extras, never both: the two builds install the same
# `faiss` module (tests/integration/test_requirements.py checks the pick).
NVIDIA_SMI ?= nvidia-smi
GPU = $(shell $(NVIDIA_SMI) -L >/dev/null 2>&1 && echo yes)
EXTRAS = dev,$(if $(GPU),gpu,eval),finetune,openvino

.DEFAULT_GOAL := help
.PHONY: rerankers rerankers-teacher rerankers-student rerankers-eval rerankers-latency rerankers-scifact demo-rerankers screenshot-rerankers
.PHONY: help setup lock docs demo serve bench bench-host bench-gpu bench-served gpu-kit gpu-check bench-store bench-overload bench-queue bench-infinity soak test test-fast test-clients test-slow lint stack-tools browser screenshot clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

setup: $(VENV)/.installed ## create .venv with torch and faiss (CPU builds unless a GPU is present) and ragrank

# $(call install-torch,BIN): the CUDA build where nvidia-smi lists a GPU, else the CPU build
# (a local CPU wheel when there is one, else PyTorch's CPU index).
define install-torch
	@if $(1)/python -c "import torch" 2>/dev/null; then \
	  echo "torch: already installed"; \
	elif [ -n "$(GPU)" ]; then \
	  echo "torch: GPU found, installing the CUDA build"; \
	  $(1)/pip install -c constraints.txt "torch==$(TORCH_VERSION)"; \
	elif $(1)/pip install --no-index --no-deps "torch==$(TORCH_VERSION)" 2>/dev/null; then \
	  echo "torch: installed the local CPU wheel"; $(1)/pip install -c constraints.txt "torch==$(TORCH_VERSION)"; \
	else \
	  echo "torch: no GPU, installing the CPU build"; \
	  $(1)/pip install -c constraints.txt "torch==$(TORCH_VERSION)" --index-url $(TORCH_CPU_INDEX) \
	    --extra-index-url https://pypi.org/simple; \
	fi
endef

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(call install-torch,$(BIN))
	$(BIN)/pip install -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

lock: setup ## recompile constraints.txt and constraints-clients.txt, the pinned versions, with uv
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra eval --extra gpu --extra finetune --extra openvino \
	  --no-header --python-version 3.11 --python-platform x86_64-manylinux_2_28 -o constraints.txt
	printf 'torch==$(TORCH_VERSION)\n' > $(VENV)/torch-pin.txt
	$(BIN)/uv pip compile pyproject.toml --extra clients --override $(VENV)/torch-pin.txt \
	  --no-header --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  -o constraints-clients.txt

docs: setup ## regenerate docs/configuration.md from the settings
	$(BIN)/python -m ragrank.reference docs/configuration.md

demo: setup ## index the bundled sample, show cosine vs reranked order, serve on :8000
	$(BIN)/ragrank demo

serve: setup ## serve the API with the configured models and store
	$(BIN)/ragrank serve

bench: setup ## load benchmark: /v1/rerank vs the model-only ceiling, other batching, Infinity
	$(BIN)/ragrank bench $(BENCH_ARGS)

bench-host: setup ## host path: /v1/rerank with a zero-layer model vs the tokenizer alone on one core; pairs/s of each reranker family
	$(BIN)/ragrank bench --host-only $(BENCH_ARGS)
	$(BIN)/python -m eval.bench.families $(FAMILIES_ARGS)

bench-gpu: setup ## one GPU: packed vs padded, budgets, kernels, server vs model, % of bf16 peak, each reranker family
	$(BIN)/python -m eval.bench.gpu $(BENCH_ARGS)

bench-served: setup ## /v1/rerank against a device model fitted to the H200: old and new engine, 1-64 clients, open loop (SERVED_ARGS)
	$(BIN)/python -m eval.bench.served $(SERVED_ARGS)

# Rerankers trained here, from real multilingual-e5-small weights on XQuAD-R's train side (a
# split by paragraph), under $(RERANKERS) (never committed): a teacher, a student distilled
# from it, the eval of both and their cascade, and each one's search latency on this machine.
E5_SMALL ?= ragrank-data/models/multilingual-e5-small-q4
XQUAD ?= ../shared/data/xquad-r
SCIFACT ?= ../shared/data/scifact
XQUAD_DIRS = $(addprefix $(XQUAD)/,ar de el en es hi ru th tr vi zh)
RERANKERS ?= runs/rerankers
# Test queries evaluated per language (the first N of the test side); empty: all of them.
EVAL_QUERIES ?= 100
SPLIT_FLAGS = --split test --split-by paragraph --split-seed 42 --test-share 0.3
TRAIN_FLAGS = --merge $(XQUAD_DIRS) $(SPLIT_FLAGS) --validation-share 0.1 \
  --max-length 128 --freeze-embeddings --head-learning-rate 5e-4 --validation-queries 110 --no-progress
# The teacher's steps; the teacher of the whole-test-side table came from 600 steps (validated
# every 150), which kept its 300-step checkpoint.
TEACHER_STEPS ?= 300
TEACHER_EVAL_EVERY ?= 100
# The student's steps of 8 queries: 1,050 is about 1.1 passes over the training side's 7,678
# queries (700 steps, 0.73 of a pass, kept none of the teacher's gain over hybrid).
STUDENT_STEPS ?= 1050
STUDENT_EVAL_EVERY ?= 350
TEACHER_SERVED = RAGRANK_EMBED_MODEL=$(E5_SMALL) RAGRANK_RERANK_MODELS=teacher=$(RERANKERS)/teacher/model
SERVED = $(TEACHER_SERVED),student=$(RERANKERS)/student/model

rerankers: rerankers-eval rerankers-latency rerankers-scifact ## train a reranker and distil a student on XQuAD-R (2 CPU cores: 3 to 4 h), evaluate both and their cascade, and the teacher on SciFact

$(E5_SMALL)/model.safetensors:
	bash ../shared/models/multilingual-e5-small-q4/build.sh $(E5_SMALL) $(BIN)/python

rerankers-teacher: setup $(E5_SMALL)/model.safetensors ## the teacher: multilingual-e5-small with a fresh head, lce on hybrid's hard negatives
	RAGRANK_EMBED_MODEL=$(E5_SMALL) $(BIN)/ragrank finetune reranker $(TRAIN_FLAGS) \
	  --output $(RERANKERS)/teacher --base $(E5_SMALL) --loss lce --learning-rate 5e-5 \
	  --negatives 8 --batch-size 4 --max-steps $(TEACHER_STEPS) --eval-every $(TEACHER_EVAL_EVERY)

rerankers-student: rerankers-teacher ## the student: the teacher's first 4 of 12 layers and its head, distilled from it (margin MSE)
	@# The teacher's split and hard negatives (the same flags would mine the same ones again).
	mkdir -p $(RERANKERS)/student
	test -f $(RERANKERS)/student/training-data.json || \
	  cp $(RERANKERS)/teacher/training-data.json $(RERANKERS)/student/
	RAGRANK_EMBED_MODEL=$(E5_SMALL) $(BIN)/ragrank finetune reranker $(TRAIN_FLAGS) \
	  --output $(RERANKERS)/student --teacher $(RERANKERS)/teacher/model \
	  --base $(RERANKERS)/teacher/model --layers 4 --negatives 4 --batch-size 8 \
	  --learning-rate 2e-4 --max-steps $(STUDENT_STEPS) --eval-every $(STUDENT_EVAL_EVERY)

rerankers-eval: rerankers-student ## each language and all 11 merged: cosine, hybrid, teacher, student and cascade at K = 5, 10, 20, each alone and blended with hybrid
	$(SERVED) RAGRANK_CASCADE=student:10 RAGRANK_RERANK_BLEND=0.5 $(BIN)/ragrank eval \
	  $(addprefix --dataset ,$(XQUAD_DIRS)) --merge $(XQUAD_DIRS) $(SPLIT_FLAGS) \
	  --systems cosine,hybrid,hybrid-reranked,hybrid-blended,cascade-first,cascade,cascade-blended \
	  --cascade-top 5 20 --candidates 20 --versus hybrid hybrid-reranked hybrid-blended \
	  $(if $(EVAL_QUERIES),--limit-queries $(EVAL_QUERIES)) --output $(RERANKERS)/eval

rerankers-scifact: rerankers-teacher ## the teacher as it is (zero-shot) on SciFact: cosine, hybrid, hybrid's top 20 reranked
	RAGRANK_EMBED_MODEL=$(E5_SMALL) RAGRANK_RERANK_MODEL=$(RERANKERS)/teacher/model $(BIN)/ragrank eval \
	  --dataset $(SCIFACT) --systems cosine,hybrid,hybrid-reranked --candidates 20 --versus hybrid \
	  --output $(RERANKERS)/scifact

rerankers-latency: rerankers-student ## /v1/search p50 and p99 of the teacher, the student and the cascade at each K, on this machine
	$(SERVED) $(BIN)/python -m eval.bench.cascade --data $(XQUAD)/en --out $(RERANKERS)/latency.json

demo-rerankers: rerankers-student ## the demo and its playground with the rerankers trained here (pick teacher or student)
	$(SERVED) $(BIN)/ragrank demo

# The demo, served with the rerankers trained here from a folder of its own, in the background
# while the browser takes the picture; stopped when it is taken.
SHOT_PORT ?= 8765
SHOT_QUERY ?= Why are leaves green?
screenshot-rerankers: rerankers-teacher browser ## retake docs/playground.png with the teacher reranking the demo collection
	$(TEACHER_SERVED) $(BIN)/ragrank demo --port $(SHOT_PORT) --qdrant-path $(RERANKERS)/demo-qdrant \
	  > $(RERANKERS)/demo.log 2>&1 & pid=$$!; trap "kill $$pid" EXIT; \
	  $(BIN)/python -m eval.screenshot --url http://127.0.0.1:$(SHOT_PORT) --out docs/playground.png \
	    --query "$(SHOT_QUERY)" --model teacher

gpu-kit: setup ## DIR=folder: wheels, code, SciFact and configs (<= 48 MiB) for an air-gapped GPU host; there: bash DIR/run-gpu-check.sh
	@test -n "$(DIR)" || { echo "usage: make gpu-kit DIR=folder" >&2; exit 2; }
	$(BIN)/python -m eval.bench.kit $(DIR) $(KIT_ARGS)

gpu-check: setup ## everything a GPU must show, one run (< 8 min): gpu tests, bench-gpu, load, exact search (GPU_CHECK_ARGS="--tiny" on a CPU)
	$(BIN)/python -m eval.bench.gpu_check $(GPU_CHECK_ARGS)

bench-store: setup ## the embedded store at 10k, 100k and 1M points: Qdrant Edge vs the local mode
	$(BIN)/python -m eval.bench.store

bench-queue: setup ## the job queue, SQLite vs PostgreSQL: jobs/s, claim, pick-up, recovery (BENCH_ARGS="--postgres-url URL")
	$(BIN)/python -m eval.bench.queue $(BENCH_ARGS)

bench-overload: setup ## overload: 4x the clients at capacity; only 200 and 429, bounded memory, recovery
	$(BIN)/python -m eval.bench.overload $(BENCH_ARGS)

soak: setup ## mixed load on one server for SOAK_MINUTES (30); SOAK_ARGS="--kills 1" adds a kill -9
	$(BIN)/python -m eval.bench.soak --minutes $(or $(SOAK_MINUTES),30) $(SOAK_ARGS)

bench-infinity: .venv-infinity/.installed ## install Infinity (the peer server) into .venv-infinity

.venv-infinity/.installed:
	test -x .venv-infinity/bin/python || $(PYTHON) -m venv .venv-infinity
	$(call install-torch,.venv-infinity/bin)
	.venv-infinity/bin/pip install "infinity-emb[server,torch]"
	touch $@

# Two pytest workers (pytest-xdist): one per core of the 2-core machines CI runs on. Each test
# file runs on one worker (`--dist loadfile`), so a module's fixtures (a served app, a browser)
# start once, not once per worker: about 75 s less on 2 cores.
TEST_WORKERS ?= 2

# The suite runs as three pytest runs, each with fresh workers: a worker keeps the memory its
# tests used (models, tokenizers, compiled graphs) until it exits, and one run of the whole
# suite grew a worker past 12 GB.
TEST_GROUPS = tests/unit "tests/integration/test_[a-m]*.py" \
  "tests/integration/test_[n-z]*.py"

test: setup $(CLIENTS_VENV)/.installed ## run the test suite (tiny models, no network), the client matrix too
	for group in $(TEST_GROUPS); do \
	  $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow" $$group || exit 1; \
	done
	$(CLIENTS_VENV)/bin/pytest tests/clients

test-fast: setup ## the unit tests alone: no model files, no subprocess, no network
	$(BIN)/pytest -n $(TEST_WORKERS) tests/unit

test-clients: $(CLIENTS_VENV)/.installed ## the client matrix: LiteLLM, LangChain, LlamaIndex, Haystack against `ragrank serve`
	$(CLIENTS_VENV)/bin/pytest tests/clients

# The frameworks' own environment: their Cohere integrations need cohere<6, dev the newest SDK.
$(CLIENTS_VENV)/.installed: pyproject.toml constraints-clients.txt | $(VENV)/.installed
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(call install-torch,$(CLIENTS_VENV)/bin)
	$(BIN)/uv pip install --python $(CLIENTS_VENV)/bin/python -c constraints-clients.txt -e '.[clients]'
	touch $@

test-slow: setup ## run the real-model and real-data tests too
	$(BIN)/pytest

lint: $(LINT_VENV)/.installed ## ruff, mypy --strict, the import layering (import-linter) and hadolint; no torch needed
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/ruff format --check .
	$(LINT_VENV)/bin/mypy
	$(LINT_VENV)/bin/lint-imports
	$(LINT_VENV)/bin/hadolint Dockerfile

$(LINT_VENV)/.installed: pyproject.toml constraints.txt
	test -x $(LINT_VENV)/bin/python || $(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/pip install -q -c constraints.txt uv
	printf 'torch\n' > $(LINT_VENV)/without.txt
	$(LINT_VENV)/bin/uv pip install --python $(LINT_VENV)/bin/python --excludes $(LINT_VENV)/without.txt \
	  -c constraints.txt -e '.[dev,eval,finetune]'
	touch $@

stack-tools: ## fetch Docker Compose v2 and Caddy so `make test` validates the compose stack too
	.ci/stack-tools

browser: ## install Debian's Chromium for the playground's browser tests (they skip without it)
	@if [ -x /usr/bin/chromium ]; then echo "browser: $$(/usr/bin/chromium --version)"; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium \
	  || { $$SUDO apt-get update && $$SUDO env DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y --no-install-recommends chromium; }; \
	else echo "browser: no apt-get here; install Chromium and set RAGRANK_CHROMIUM to it" >&2; fi

screenshot: setup browser ## retake docs/playground.png, the playground picture the README shows
	RAGRANK_PLAYGROUND_SCREENSHOT=docs/playground.png $(BIN)/pytest -q \
	  tests/integration/test_playground.py -k screenshot

clean: ## remove the virtualenv, caches and local data
	rm -rf $(VENV) .venv-infinity $(CLIENTS_VENV) $(LINT_VENV) .mypy_cache .ruff_cache .pytest_cache ragrank-data *.egg-info
