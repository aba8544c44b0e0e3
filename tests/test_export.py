"""Export: SavedModel parity in a fresh process without this project, TFLite quality, bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bgem3_embeddings.cli import app
from bgem3_embeddings.export.options import ExportError
from bgem3_embeddings.export.staging import staged_output
from tests.reference_m3 import ReferenceM3, assert_batch_matches_reference

OUTPUTS = ("dense_vecs", "sparse_weights", "colbert_vecs")
# (batch, length, padding side): varied batch sizes and lengths, right and left padding.
CASES = [
    (1, 2, "right"),
    (1, 9, "left"),
    (3, 17, "right"),
    (3, 17, "left"),
    (4, 33, "left"),
    (7, 64, "right"),
    (7, 64, "left"),
]

# Runs in a fresh interpreter: only TensorFlow, numpy and tokenizers may be used.
LOADER = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    from tokenizers import Tokenizer

    export_dir, inputs_path, outputs_path = sys.argv[1:4]
    fn = tf.saved_model.load(export_dir).signatures["serving_default"]
    data = np.load(inputs_path)
    results = {}
    for key in sorted({k.rsplit("_", 1)[0] for k in data.files if k.startswith("case")}):
        out = fn(input_ids=tf.constant(data[key + "_ids"]), attention_mask=tf.constant(data[key + "_mask"]))
        for name, value in out.items():
            results[key + "_" + name] = value.numpy()
    tokenizer = Tokenizer.from_file(export_dir + "/tokenizer/tokenizer.json")
    results["tokens"] = np.array(tokenizer.encode("What is BGE M3?").ids, dtype=np.int32)
    np.savez(outputs_path, **results)
    assert "bgem3_embeddings" not in sys.modules, "the exported model must load without this project"
""")


def make_batch(batch: int, length: int, side: str, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random real tokens between <s> and </s>, padded with id 1 to `length`; row 0 is full length."""
    rng = np.random.default_rng(seed)
    ids = np.full((batch, length), 1, np.int32)
    mask = np.zeros((batch, length), np.int32)
    for row in range(batch):
        n = length if row == 0 else int(rng.integers(2, length + 1))
        tokens = [0, *rng.integers(4, vocab, n - 2).tolist(), 2]
        cols = slice(0, n) if side == "right" else slice(length - n, length)
        ids[row, cols] = tokens
        mask[row, cols] = 1
    return ids, mask


def keras_outputs(encoder: object, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    out = encoder.model({"input_ids": ids, "attention_mask": mask})  # type: ignore[attr-defined]
    return {k: np.asarray(v) for k, v in out.items()}


def reference_outputs(reference: ReferenceM3, ids: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """The reference's outputs of each row's real tokens (right-padded on its side, as FlagEmbedding pads)."""
    return reference.encode_ids([row[m.astype(bool)].tolist() for row, m in zip(ids, mask, strict=True)])


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> ReferenceM3:
    return ReferenceM3(tiny_checkpoint)


@pytest.fixture(scope="module")
def saved_model_dir(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SavedModel exported through the CLI."""
    out = tmp_path_factory.mktemp("export") / "saved_model"
    args = ["export", str(out), "--format", "saved_model", "--model", str(tiny_checkpoint)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_saved_model_equals_the_reference_in_a_fresh_process(
    saved_model_dir: Path, tiny_encoder: object, reference: ReferenceM3, tmp_path: Path
) -> None:
    vocab = tiny_encoder.config.vocab_size  # type: ignore[attr-defined]
    inputs = {}
    for i, (batch, length, side) in enumerate(CASES):
        inputs[f"case{i}_ids"], inputs[f"case{i}_mask"] = make_batch(batch, length, side, vocab, seed=i)
    np.savez(tmp_path / "inputs.npz", **inputs)
    script = tmp_path / "load_export.py"
    script.write_text(LOADER)
    # cwd outside the repository, so the project could not be imported even by accident.
    command = [
        sys.executable,
        str(script),
        str(saved_model_dir),
        str(tmp_path / "inputs.npz"),
        str(tmp_path / "outputs.npz"),
    ]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "outputs.npz")
    for i, (batch, length, _) in enumerate(CASES):
        ids, mask = inputs[f"case{i}_ids"], inputs[f"case{i}_mask"]
        out = {name: got[f"case{i}_{name}"] for name in OUTPUTS}
        assert all(value.dtype == np.float32 for value in out.values())
        assert out["dense_vecs"].shape == (batch, tiny_encoder.config.hidden_size)  # type: ignore[attr-defined]
        assert out["sparse_weights"].shape == (batch, length)
        assert out["colbert_vecs"].shape[:2] == (batch, length - 1)
        assert_batch_matches_reference(out, ids, mask, reference_outputs(reference, ids, mask))
    expected_tokens = tiny_encoder.tokenizer("What is BGE M3?")["input_ids"]  # type: ignore[attr-defined]
    assert got["tokens"].tolist() == expected_tokens


def test_saved_model_manifest_and_tokenizer(saved_model_dir: Path, tiny_encoder: object) -> None:
    manifest = json.loads((saved_model_dir / "export_manifest.json").read_text())
    config = tiny_encoder.config  # type: ignore[attr-defined]
    assert manifest["format"] == "saved_model"
    assert manifest["weights"] == "float32"
    assert manifest["signature"] == "serving_default"
    assert list(manifest["outputs"]) == list(OUTPUTS)
    assert manifest["outputs"]["dense_vecs"]["shape"] == [None, config.hidden_size]
    assert manifest["outputs"]["colbert_vecs"]["shape"] == [None, None, config.colbert_dim]
    assert manifest["inputs"]["input_ids"] == {"dtype": "int32", "shape": [None, None]}
    assert manifest["special_token_ids"] == {"cls": 0, "eos": 2, "pad": 1, "unk": 3}
    assert manifest["bgem3_embeddings_version"]
    assert (saved_model_dir / "saved_model.pb").is_file()
    assert (saved_model_dir / "tokenizer" / "tokenizer.json").is_file()
    assert (saved_model_dir / "tokenizer" / "sentencepiece.bpe.model").is_file()
    # No staging folder left next to the export.
    assert not [p for p in saved_model_dir.parent.iterdir() if ".partial-" in p.name]


# Bounds from what quantization costs, with room for other CPUs' kernels (measured on a Zen 5: float16
# weights, dense cosine >= 0.99999994, ColBERT rows >= 0.9999996, sparse weights within 1.2e-3 at 0.59;
# int8 dynamic range: 0.99988, 0.99965, 0.037). A pad leak or a shifted row (1e-2 and more) fails them.
@pytest.mark.parametrize(
    ("quantize", "min_cosine", "sparse_tol"),
    [("float16", 0.99999, {"atol": 5e-3, "rtol": 0.0}), ("int8", 0.999, {"atol": 0.05, "rtol": 0.05})],
)
def test_tflite_quality(
    quantize: str,
    min_cosine: float,
    sparse_tol: dict[str, float],
    tiny_encoder: object,
    reference: ReferenceM3,
    tmp_path: Path,
) -> None:
    from bgem3_embeddings.export.quality import compare, keras_runner, sample_token_ids
    from bgem3_embeddings.export.tflite import export_tflite, load_tflite

    out = export_tflite(tiny_encoder, tmp_path / "tflite", quantize=quantize)
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert manifest["format"] == "tflite" and manifest["model_file"] == "model.tflite"
    assert manifest["model_bytes"] == (out / "model.tflite").stat().st_size
    runner = load_tflite(out)
    report = compare(
        keras_runner(tiny_encoder),
        runner,
        sample_token_ids(tiny_encoder),
        tiny_encoder.tokenizer.pad_token_id,
        quantize,
    )  # type: ignore[attr-defined]
    assert report.dense_cosine_min >= min_cosine
    assert report.colbert_vec_cosine_min >= min_cosine
    assert report.colbert_score_max_diff < 0.01
    # Against the reference, through the same interpreter: dynamic batch sizes and lengths, both padding
    # sides. Each row's dense vector and its real ColBERT rows are the reference's up to quantization.
    vocab = tiny_encoder.config.vocab_size  # type: ignore[attr-defined]
    for i, (batch, length, side) in enumerate(CASES):
        ids, mask = make_batch(batch, length, side, vocab, seed=100 + i)
        got, ref = runner(ids, mask), reference_outputs(reference, ids, mask)
        cosine = np.sum(got["dense_vecs"] * ref["dense_vecs"], axis=-1)
        assert cosine.min() >= min_cosine, (i, side, cosine)
        assert got["colbert_vecs"].shape == (batch, length - 1, ref["colbert_vecs"][0].shape[1])
        for row, m in enumerate(mask):
            n = int(m.sum())
            rows = got["colbert_vecs"][row]
            row_cosine = np.sum(rows[: n - 1] * ref["colbert_vecs"][row], axis=-1)
            assert row_cosine.size == 0 or row_cosine.min() >= min_cosine, (i, side, row, row_cosine)
            assert np.all(rows[n - 1 :] == 0)
            weights = got["sparse_weights"][row]
            np.testing.assert_allclose(weights[m == 1], ref["token_weights"][row], **sparse_tol)
            assert np.all(weights[m == 0] == 0)  # padding stays exactly zero


# ---------------------------------------------------------------- bad arguments
def invoke(*args: str) -> object:
    return CliRunner().invoke(app, ["export", *args])


def test_non_empty_out_is_refused_and_untouched(tmp_path: Path, tiny_checkpoint: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    result = invoke(str(out), "--model", str(tiny_checkpoint))
    assert result.exit_code == 2
    assert "not empty" in result.output
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_out_that_is_a_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "model.tflite"
    out.write_bytes(b"old")
    result = invoke(str(out), "--format", "tflite")
    assert result.exit_code == 2
    assert "not a folder" in result.output
    assert out.read_bytes() == b"old"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "onnx"], "unknown export format 'onnx'"),
        (["--format", "tflite", "--quantize", "int4"], "unknown quantize 'int4'"),
        (["--format", "saved_model", "--quantize", "int8"], "applies to tflite only"),
        (["--format", "saved_model", "--precision", "int8"], "unknown precision 'int8'"),
        (["--format", "tflite", "--precision", "bfloat16"], "starts from float32"),
    ],
)
def test_bad_options_are_refused_before_loading(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "out"
    # A model that does not exist: the options must be refused before any loading is attempted.
    result = invoke(str(out), "--model", str(tmp_path / "no-such-model"), *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not out.exists()


def test_missing_model_is_a_clean_error(tmp_path: Path) -> None:
    """CheckpointNotFoundError reaches run_cli, which prints it in one line (tests/test_cli_errors.py)."""
    from bgem3_embeddings.checkpoint.files import CheckpointNotFoundError

    result = invoke(str(tmp_path / "out"), "--model", str(tmp_path / "no-such-model"))
    assert result.exit_code == 1
    assert isinstance(result.exception, CheckpointNotFoundError)
    assert "does not exist" in str(result.exception)
    assert not (tmp_path / "out").exists()


def test_export_model_raises_export_error(tmp_path: Path) -> None:
    from bgem3_embeddings.export import export_model

    with pytest.raises(ExportError, match="unknown export format"):
        export_model(tmp_path / "ckpt", tmp_path / "out", format="coreml")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_model(tmp_path / "ckpt", tmp_path / "full")


def test_failed_export_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="converter crashed"), staged_output(out) as staging:
        (staging / "saved_model.pb").write_bytes(b"half")
        raise RuntimeError("converter crashed")
    assert list(tmp_path.iterdir()) == []


def test_staging_replaces_an_empty_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with staged_output(out) as staging:
        (staging / "model.tflite").write_bytes(b"ok")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (out / "model.tflite").read_bytes() == b"ok"


def test_out_filled_during_export_is_not_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ExportError, match="not empty"), staged_output(out) as staging:
        (staging / "model.tflite").write_bytes(b"new")
        out.mkdir()
        (out / "theirs").write_text("theirs")
    assert [p.name for p in out.iterdir()] == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
