"""Session fixtures shared by the core tests and the integrations' tests.

Tiny checkpoints are generated once per session (a few seconds; needs torch + sentencepiece) by
tests/tiny_checkpoint.py, in the exact BAAI/bge-m3 file layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.optional import require_module

# `make test-other-backend` runs the suites again on Keras' PyTorch backend in a process that cannot import
# TensorFlow (as on a machine without it): hidden before anything imports Keras.
if os.environ.get("BGEM3_TEST_HIDE_TENSORFLOW") == "1":
    from tests.no_tensorflow import hide_tensorflow

    hide_tensorflow()

TINY_SEED = 0  # both fixtures use it, so their weights are identical


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint directory with model.safetensors (no pytorch_model.bin) and both heads."""
    require_module("torch", reason="generating tiny checkpoints needs torch (the dev extra)")
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny_checkpoint"), weights="safetensors", seed=TINY_SEED
    )


@pytest.fixture(scope="session")
def tiny_checkpoint_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights as `tiny_checkpoint`, as pytorch_model.bin only (no safetensors)."""
    require_module("torch", reason="generating tiny checkpoints needs torch (the dev extra)")
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny_checkpoint_pt"), weights="pytorch", seed=TINY_SEED
    )


@pytest.fixture(scope="session")
def tiny_reranker_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random cross-encoder in the BAAI/bge-reranker-v2-m3 layout (XLMRobertaForSequenceClassification,
    one label; model.safetensors) with the tiny checkpoints' tokenizer."""
    require_module("torch", reason="generating tiny checkpoints needs torch (the dev extra)")
    from tests.tiny_checkpoint import make_tiny_reranker_checkpoint

    return make_tiny_reranker_checkpoint(
        tmp_path_factory.mktemp("tiny_reranker_checkpoint"), weights="safetensors", seed=TINY_SEED
    )


@pytest.fixture(scope="session")
def no_dropout_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with dropout 0 in a copy of its config.json, for the fine-tuning tests that hold
    our training step to FlagEmbedding's: both sides then compute the same function."""
    import json
    import shutil

    folder = tmp_path_factory.mktemp("finetune") / "tiny-no-dropout"
    shutil.copytree(tiny_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


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
