# The README's two commands: `make demo` (ingest + hybrid search on the embedded Qdrant) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# --no-compile: pip would byte-compile all 32,000 .py files of the installed packages (TensorFlow, torch, JAX,
# Ray, Spark, ...): a fresh `make setup-dev` took 245 s with that and 135 s without (2-vCPU EPYC). Python
# compiles the few thousand a run imports on first import instead, as it does for any module without a .pyc.
PIP_INSTALL := $(PIP) install -q --no-compile
# ... which needs Python to write each module's .pyc when it first imports it. Some machines set
# PYTHONDONTWRITEBYTECODE=1 (this project's CI machine does): with it and --no-compile, every process compiled
# TensorFlow from source again (`import tensorflow`: 22 s of CPU instead of 7.4 s with its .pyc, 2-vCPU EPYC).
unexport PYTHONDONTWRITEBYTECODE
# torch is pinned (CPU build); an unpinned torch pulls several GB of CUDA packages.
TORCH_PIN := torch==2.13.0
# KerasHub, the Keras peer in `bgem3 bench` (--engine kerashub*): installed without its dependencies, as its
# tensorflow-text requirement would pin (and so change) TensorFlow; what it imports is installed already.
KERAS_HUB_PIN := keras-hub==0.32.0
# Flower (bgem3-qdrant's `federated` extra), likewise without its dependencies: every flwr release declares
# protobuf<7, typer<0.21 and rich<15 (1.42.0: also packaging<26, fastapi<0.139), where this venv has
# protobuf 7.36 (sentencepiece 0.2.3's generated code needs it) and newer typer/rich/fastapi; its own
# tests (test_qdrant_federated*) run it on these. Its dependencies that are missing here are listed.
FLWR_PIN := flwr==1.42.0
FLWR_DEPS := "grpcio-health-checking>=1.70,<2" "iterators>=0.0.2,<0.0.3" "pycryptodome>=3.18,<4" \
	"tomli>=2.0.1,<3" "tomli-w>=1,<2" "prompt-toolkit>=3.0.52,<4" wcwidth "alembic>=1.18.1,<2" Mako \
	"uv>=0.13.5,<0.14"

# setuptools warns at every editable install (a block of asterisks per package) about folders named like
# the package: in a source checkout that is the point. A PYTHONWARNINGS of your own wins.
export PYTHONWARNINGS ?= ignore:Editable installation

.PHONY: help setup setup-demo setup-dev check-system check-test-deps docs docs-strict test test-other-backend test-slow test-ray-cluster test-spark-cluster test-flower-cluster test-ci-slow test-tf218 lint demo bench clean clean-demo

# `make` alone, or `make help`: what each target does.
.DEFAULT_GOAL := help
help:
	@echo "make demo          set up (.venv), ingest examples/corpus into ./qdrant_data, run hybrid searches"
	@echo "                   (BGEM3_MODEL=tiny: offline, on a generated tiny model; BGEM3_MODEL=FOLDER or a hub id)"
	@echo "make test          check the system (Python >= 3.11, chromium, chromedriver), set up, run the test suite"
	@echo "make test-slow     the full-size (568M) parity and memory tests"
	@echo "make test-tf218    the core suite on TensorFlow 2.18 (the metal extra's), in .venv-tf218"
	@echo "make lint          ruff + mypy"
	@echo "make docs          build the documentation site into site/ (open site/index.html)"
	@echo "make bench         bgem3 bench: throughput against the other engines"
	@echo "make setup-demo    only the demo's venv; make setup / setup-dev: everything the tests use"
	@echo "make check-system  only what make test needs from the system, with the apt and Homebrew lines"
	@echo "make clean-demo    drop the demo collections (bgem3-demo*); your collections stay"
	@echo "make clean         remove the venvs, .cache and ./qdrant_data with ALL its collections"

# What `make demo` uses: the core with the serve extra (the README's next step is `bgem3 serve`) and
# bgem3-qdrant without its extras: no Ray, no torch (docs/performance/ingest.md#what-make-demo-installs has the sizes).
$(VENV)/.demo-done: Makefile pyproject.toml integrations/qdrant/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP_INSTALL) -e ".[serve]" -e "integrations/qdrant"
	touch $@

setup-demo: $(VENV)/.demo-done

# Everything the tests use besides: bgem3-qdrant's extras and both framework integrations.
$(VENV)/.setup-done: $(VENV)/.demo-done $(wildcard integrations/*/pyproject.toml)
	$(PIP_INSTALL) -e ".[serve]" -e "integrations/qdrant[ray,spark,eval,mcp]" -e "integrations/langchain[qdrant]" -e "integrations/llama-index[qdrant]"
	touch $@

setup: $(VENV)/.setup-done

$(VENV)/.dev-done: $(VENV)/.setup-done
	$(PIP_INSTALL) $(TORCH_PIN)
	$(PIP_INSTALL) -e ".[dev,docs]" "langchain-tests>=0.3"
	$(PIP_INSTALL) --no-deps $(KERAS_HUB_PIN)
	$(PIP_INSTALL) --no-deps $(FLWR_PIN) $(FLWR_DEPS)
	touch $@

setup-dev: $(VENV)/.dev-done

# Tests skip when an optional package is missing; in `make test` every one must be there, so a broken
# install fails loudly instead of turning into skipped tests. The imports take about 40 s of CPU on 2 vCPUs
# (two processes side by side: 26 s of wall where one after the other took 36 s), so they run again only
# when the venv's packages change (pip touches site-packages): CI's second pytest run skips them. The
# browser check is cheap and runs every time.
SITE_PACKAGES := $(wildcard $(VENV)/lib/python3*/site-packages)
$(VENV)/.test-deps-ok: $(VENV)/.dev-done $(SITE_PACKAGES)
	$(PY) -c "from tests.flagembedding_ref import m3_embedder_class; m3_embedder_class()" & reference=$$!; \
	$(PY) -c "import torch, jax, safetensors.torch, onnx, onnxruntime, ray, aiohttp_cors, fastapi, uvicorn, prometheus_client, httpx, openai, langchain_openai, huggingface_hub, langchain_huggingface, qdrant_edge, scipy, pytrec_eval, langchain_qdrant, langchain_tests, bgem3_qdrant, llama_index.vector_stores.qdrant, llama_index.embeddings.bgem3, langchain_bgem3, selenium, mcp, pyspark, keras_hub, cohere, llama_index.postprocessor.tei_rerank, langchain_classic, ai_edge_litert, xdist, psutil, flwr" && \
	wait $$reference
	touch $@

# What the tests need from the system (Python >= 3.11 with venv, chromium and chromedriver), checked before
# anything installs: each missing piece is one line with its apt and Homebrew command. Listed first below, so
# (make runs prerequisites in order) a fresh `make test` stops here, not after minutes of pip.
check-system:
	@PYTHON="$(PYTHON)" sh tools/check_system.sh

check-test-deps: check-system $(VENV)/.test-deps-ok

# The integrations' suites run once more on Keras' PyTorch backend, in a process that cannot import
# TensorFlow (tests/no_tensorflow.py), as on a machine without it (docs/backends.md).
OTHER_BACKEND := torch
OTHER_BACKEND_TESTS := integrations/langchain integrations/llama-index \
	integrations/qdrant/tests/test_qdrant_ingest_search.py integrations/qdrant/tests/test_qdrant_explain.py \
	tests/test_serve.py tests/test_explain_serve.py

# The suite is CPU-bound (most of a test's time is a fresh process importing TensorFlow, as a user's command
# does): one pytest-xdist worker per core, at most TEST_WORKERS_MAX; `--dist loadfile` keeps each test file
# on one worker, so a module's server or cluster starts once. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= auto
TEST_WORKERS_MAX ?= 4
XDIST = -n $(TEST_WORKERS) --maxprocesses $(TEST_WORKERS_MAX) --dist loadfile
# The slowest tests, listed at the end of each run: where to cut when CI nears its 30 minutes; and every
# failure and skip with its reason (-rfEs: -rs alone drops the failures from the summary), so a run shows that none is a missing package or a broken module (issue 60).
SLOWEST = --durations=15 --durations-min=10 -rfEs

# The documentation site (mkdocs.yml): `make docs` builds it into site/ (git-ignored). `make test` builds it
# with --strict first (a few seconds), so a broken link or anchor, or a page missing from the nav, fails. The
# CLI and HTTP references are generated from the code (tools/docs_reference.py): no model, no network.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: $(VENV)/.dev-done
	$(MKDOCS) build

docs-strict: check-test-deps
	$(MKDOCS) build --strict --quiet

test: check-test-deps docs-strict
	$(PY) -m pytest -q $(XDIST) $(SLOWEST)
	KERAS_BACKEND=$(OTHER_BACKEND) BGEM3_TEST_HIDE_TENSORFLOW=1 $(PY) -m pytest -q -rfEs $(XDIST) $(OTHER_BACKEND_TESTS)

test-other-backend: check-test-deps
	KERAS_BACKEND=$(OTHER_BACKEND) BGEM3_TEST_HIDE_TENSORFLOW=1 $(PY) -m pytest -q $(XDIST) $(OTHER_BACKEND_TESTS)

test-slow: setup-dev
	$(PY) -m pytest -q -m slow

# The Ray engine on a 3-node Ray cluster of this machine (3 minutes on 2 vCPUs, so marked slow).
RAY_CLUSTER_TESTS := integrations/qdrant/tests/test_qdrant_ray_cluster.py
test-ray-cluster: check-test-deps
	$(PY) -m pytest -q -m slow $(RAY_CLUSTER_TESTS)

# The Spark engine, the DataFrame API and the SavedModel Spark job on a Spark standalone cluster of this
# machine (a master and two one-core workers on loopback; needs Java 17+; slow).
SPARK_CLUSTER_TESTS := integrations/qdrant/tests/test_qdrant_spark_cluster.py
test-spark-cluster: check-test-deps
	$(PY) -m pytest -q -m slow $(SPARK_CLUSTER_TESTS)

# Federated tuning on a Flower federation of this machine (a SuperLink and two SuperNodes, real processes on
# loopback, insecure mode; slow).
FLOWER_CLUSTER_TESTS := integrations/qdrant/tests/test_qdrant_federated.py
test-flower-cluster: check-test-deps
	$(PY) -m pytest -q -m slow $(FLOWER_CLUSTER_TESTS)

# What .ci/run adds to `make test`: both clusters (side by side, a worker each: 340 s on 2 vCPUs where one
# after the other took 435 s) and the MCP Inspector's CLI against `bgem3-qdrant mcp` (needs node >= 22.19).
MCP_SLOW_TESTS := integrations/qdrant/tests/test_qdrant_mcp.py
test-ci-slow: check-test-deps
	$(PY) -m pytest -q -m slow $(XDIST) $(SLOWEST) $(RAY_CLUSTER_TESTS) $(SPARK_CLUSTER_TESTS) $(FLOWER_CLUSTER_TESTS) \
		$(MCP_SLOW_TESTS)

# The core suite on the TensorFlow a Mac user gets from the `metal` extra (tensorflow-metal is documented
# for TF 2.18 only), in its own venv so the main one keeps the newest TensorFlow. Not part of `make test`
# (a second TensorFlow install costs minutes of set-up); run it when touching TensorFlow-facing code.
TF218_VENV ?= .venv-tf218
TF218_PY := $(TF218_VENV)/bin/python
# sentencepiece (dev only: tests/tiny_checkpoint.py builds tokenizer.json with it): 0.2.3's generated protobuf
# code needs protobuf >= 7.36 at run time, which TF 2.18 (protobuf < 6) excludes; 0.2.2 works with both.
TF218_PINS := "tensorflow==2.18.*" "sentencepiece<0.2.3"
$(TF218_VENV)/.setup-done: Makefile pyproject.toml
	$(PYTHON) -m venv $(TF218_VENV)
	$(TF218_PY) -m pip install -q --upgrade pip
	$(TF218_PY) -m pip install -q $(TF218_PINS) $(TORCH_PIN) -e ".[dev]"
	$(TF218_PY) -c "import tensorflow as tf; assert tf.__version__.startswith('2.18.'), tf.__version__"
	touch $@

test-tf218: $(TF218_VENV)/.setup-done
	$(TF218_PY) -c "import tensorflow as tf, keras; print('tensorflow', tf.__version__, 'keras', keras.__version__)"
	$(TF218_PY) -m pytest -q tests

lint: setup-dev
	$(VENV)/bin/ruff check bgem3_embeddings tests integrations examples benchmarks tools
	$(VENV)/bin/mypy

# BGEM3_MODEL: a hub id or a local checkpoint directory; "tiny" generates a tiny test checkpoint (and
# installs the pinned torch for it, only then). Each model gets its own demo collection
# (examples/run_demo.sh); BGEM3_DEMO_COLLECTION names another.
BGEM3_MODEL ?= BAAI/bge-m3
BGEM3_DEMO_COLLECTION ?=
DEMO_ENV = BGEM3_MODEL="$(BGEM3_MODEL)" BGEM3_DEMO_COLLECTION="$(BGEM3_DEMO_COLLECTION)" PY="$(PY)" PIP="$(PIP)" TORCH_PIN="$(TORCH_PIN)"
demo: setup-demo
	$(DEMO_ENV) bash examples/run_demo.sh

# Drops the demo collections (bgem3-demo*) and the tiny checkpoint; your collections and the venv stay.
clean-demo: setup-demo
	$(DEMO_ENV) bash examples/run_demo.sh --clean

bench: setup-dev
	$(VENV)/bin/bgem3 bench

# Everything set up or written here: both venvs, .cache (the tiny checkpoint, converted weights) and the
# default store ./qdrant_data with ALL its collections, not only the demo's (`make clean-demo`: those only).
clean:
	rm -rf $(VENV) $(TF218_VENV) .cache qdrant_data
