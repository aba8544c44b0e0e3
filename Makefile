# The README's two commands: `make demo` (ingest + hybrid search on the embedded Qdrant) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned (CPU build); an unpinned torch pulls several GB of CUDA packages.
TORCH_PIN := torch==2.13.0

.PHONY: setup setup-dev check-test-deps test test-slow lint demo bench clean

$(VENV)/.setup-done: Makefile pyproject.toml $(wildcard integrations/*/pyproject.toml)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e . -e "integrations/qdrant[ray]" -e "integrations/langchain[qdrant]" -e "integrations/llama-index[qdrant]"
	touch $@

setup: $(VENV)/.setup-done

$(VENV)/.dev-done: $(VENV)/.setup-done
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e ".[dev]" "langchain-tests>=0.3"
	touch $@

setup-dev: $(VENV)/.dev-done

# Tests skip when an optional package is missing; in `make test` every one must be there, so a broken
# install fails loudly instead of turning into skipped tests.
check-test-deps: setup-dev
	$(PY) -c "import torch, safetensors.torch, ray, qdrant_edge, langchain_qdrant, langchain_tests, bgem3_qdrant, llama_index.vector_stores.qdrant, llama_index.embeddings.bgem3, langchain_bgem3"

test: check-test-deps
	$(PY) -m pytest -q

test-slow: setup-dev
	$(PY) -m pytest -q -m slow

lint: setup-dev
	$(VENV)/bin/ruff check bgem3_embeddings tests integrations examples
	$(VENV)/bin/mypy

# BGEM3_MODEL: a hub id or a local checkpoint directory; "tiny" generates a tiny test checkpoint (needs torch).
BGEM3_MODEL ?= BAAI/bge-m3
demo: setup
	BGEM3_MODEL="$(BGEM3_MODEL)" PY="$(PY)" PIP="$(PIP)" TORCH_PIN="$(TORCH_PIN)" bash examples/run_demo.sh

bench: setup-dev
	$(VENV)/bin/bgem3 bench

clean:
	rm -rf $(VENV) .cache qdrant_data
