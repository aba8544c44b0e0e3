"""Full-size (568M parameter, random weights) export: TFLite fp16 fits under 2 GB and keeps quality.

Slow (several minutes, about 13 GB of memory at peak on a 2-core machine): `pytest -m slow`.
Set BGEM3_FULL_CHECKPOINT to an existing full-size checkpoint folder to skip generating one.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.optional import require_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def full_encoder(tmp_path_factory: pytest.TempPathFactory) -> object:
    from bgem3_embeddings import BGEM3Encoder

    path = os.environ.get("BGEM3_FULL_CHECKPOINT")
    if not path:
        require_module("torch", reason="generating the full-size checkpoint needs torch")
        from tests.tiny_checkpoint import make_tiny_checkpoint

        path = str(make_tiny_checkpoint(tmp_path_factory.mktemp("full"), size="full", seed=3))
    return BGEM3Encoder(path, precision="float32", device="cpu")


def test_full_size_tflite_float16(full_encoder: object, tmp_path: Path) -> None:
    from bgem3_embeddings.export.quality import compare, keras_runner, sample_token_ids
    from bgem3_embeddings.export.tflite import MODEL_FILE, export_tflite, load_tflite

    out = export_tflite(full_encoder, tmp_path / "fp16", quantize="float16")
    size = (out / MODEL_FILE).stat().st_size
    assert 1.0e9 < size < 2**31  # about half of the 2.27 GB fp32 weights
    report = compare(
        keras_runner(full_encoder),
        load_tflite(out),
        sample_token_ids(full_encoder),
        full_encoder.tokenizer.pad_token_id,
        "float16",
        size,
    )  # type: ignore[attr-defined]
    assert report.dense_cosine_min >= 0.999
    assert report.colbert_vec_cosine_min >= 0.99
    assert report.colbert_score_max_diff < 0.01


def test_full_size_tflite_float32_is_refused(full_encoder: object, tmp_path: Path) -> None:
    from bgem3_embeddings.export.options import ExportError
    from bgem3_embeddings.export.tflite import export_tflite

    with pytest.raises(ExportError, match="2 GB"):
        export_tflite(full_encoder, tmp_path / "fp32", quantize="none")
    assert not (tmp_path / "fp32").exists()
