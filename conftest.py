"""Session fixtures shared by the core tests and the integrations' tests.

Tiny checkpoints are generated once per session (a few seconds; needs torch + sentencepiece) by
tests/tiny_checkpoint.py, in the exact BAAI/bge-m3 file layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# `make test-other-backend` runs the suites again on Keras' PyTorch backend in a process that cannot import
# TensorFlow (as on a machine without it): hidden before anything imports Keras.
if os.environ.get("BGEM3_TEST_HIDE_TENSORFLOW") == "1":
    from tests.no_tensorflow import hide_tensorflow

    hide_tensorflow()

# The slowest test files (junit times of `make test`'s main suite, 2 xdist workers on 2 vCPUs, 50-120 s
# each) run first: `--dist loadfile` hands out whole files in collection order, and one of these handed out
# last kept the other worker idle until it ended. Any order is correct; this one only ends sooner.
SLOW_FILES_FIRST = (
    "tests/test_bench.py",
    "integrations/qdrant/tests/test_qdrant_check.py",
    "integrations/qdrant/tests/test_qdrant_cli_failures.py",
    "tests/test_make_demo.py",
    "integrations/qdrant/tests/test_qdrant_explain.py",
    "tests/test_quiet_import.py",
    "tests/test_docs_python_blocks.py",
    "integrations/qdrant/tests/test_qdrant_ray.py",
    "integrations/qdrant/tests/test_qdrant_pooling.py",
    "integrations/qdrant/tests/test_qdrant_cli_errors.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of SLOW_FILES_FIRST first, in that order; every other file after them, as collected."""
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    root = Path(str(config.rootpath))

    def key(item: pytest.Item) -> int:
        try:
            name = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(name, len(rank))

    items.sort(key=key)  # stable: tests keep their order within a file, other files theirs


TINY_SEED = 0  # both fixtures use it, so their weights are identical


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint directory with model.safetensors (no pytorch_model.bin) and both heads."""
    pytest.importorskip("torch", reason="generating tiny checkpoints needs torch (the dev extra)")
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny_checkpoint"), weights="safetensors", seed=TINY_SEED
    )


@pytest.fixture(scope="session")
def tiny_checkpoint_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as `tiny_checkpoint`, as pytorch_model.bin only (no safetensors)."""
    pytest.importorskip("torch", reason="generating tiny checkpoints needs torch (the dev extra)")
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny_checkpoint_pt"), weights="pytorch", seed=TINY_SEED
    )


@pytest.fixture(scope="session")
def tiny_reranker_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random cross-encoder in the BAAI/bge-reranker-v2-m3 layout (XLMRobertaForSequenceClassification,
    one label; model.safetensors) with the tiny checkpoints' tokenizer."""
    pytest.importorskip("torch", reason="generating tiny checkpoints needs torch (the dev extra)")
    from tests.tiny_checkpoint import make_tiny_reranker_checkpoint

    return make_tiny_reranker_checkpoint(
        tmp_path_factory.mktemp("tiny_reranker_checkpoint"), weights="safetensors", seed=TINY_SEED
    )


@pytest.fixture(scope="session", autouse=True)
def _converted_weights_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Encoders built by the tests keep their converted weights in a temporary folder, not in ~/.cache."""
    os.environ.setdefault("BGEM3_WEIGHTS_CACHE", str(tmp_path_factory.mktemp("converted_weights")))


# --- Encoder fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_encoder(tiny_checkpoint: Path) -> object:
    """One BGEM3Encoder on the tiny checkpoint, shared by every test of the session (fp32, CPU)."""
    from bgem3_embeddings import BGEM3Encoder

    return BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu")
