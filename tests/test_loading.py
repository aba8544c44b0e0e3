"""Checkpoint loading: formats, the hub path (offline), heads, and clear errors for broken checkpoints."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings import BGEM3Encoder
from bgem3_embeddings.checkpoint.files import CheckpointNotFoundError, download_checkpoint
from bgem3_embeddings.checkpoint.porting import WeightPortingError
from bgem3_embeddings.config import ConfigError
from bgem3_embeddings.loading import MissingHeadError
from tests.tolerances import SCALED, UNIT_VECTORS

TEXTS = ["What is BGE M3?", "BM25 is a bag-of-words retrieval function", ""]
ALL = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}


def _copy(src: Path, dst: Path, *, without: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst)
    for name in without:
        (dst / name).unlink()
    return dst


def _assert_same_weights(a: Any, b: Any) -> None:
    """Every variable of both encoders' models, bit for bit (the tiny encoder matches the reference)."""
    va = {v.path: np.asarray(v) for v in a.model.variables}
    vb = {v.path: np.asarray(v) for v in b.model.variables}
    assert va.keys() == vb.keys() and va
    for name, value in va.items():
        np.testing.assert_array_equal(value, vb[name], err_msg=name)


def test_safetensors_and_torch_pickle_give_identical_outputs(
    tiny_encoder: Any, tiny_checkpoint_pt: Path
) -> None:
    assert not (tiny_checkpoint_pt / "model.safetensors").exists()
    from_pickle = BGEM3Encoder(tiny_checkpoint_pt, precision="float32", device="cpu")
    _assert_same_weights(from_pickle, tiny_encoder)
    # Outputs within float32 rounding: a new encoder runs its first short batches eagerly, the shared one
    # through its traced function (docs/performance/memory-and-startup.md#start-up), which sums in another
    # order.
    a, b = tiny_encoder.encode(TEXTS, **ALL), from_pickle.encode(TEXTS, **ALL)
    np.testing.assert_allclose(a["dense_vecs"], b["dense_vecs"], **UNIT_VECTORS)
    for x, y in zip(a["lexical_weights"], b["lexical_weights"], strict=True):
        assert x.keys() == y.keys()
        np.testing.assert_allclose([x[k] for k in x], [y[k] for k in x], **SCALED)
    for x, y in zip(a["colbert_vecs"], b["colbert_vecs"], strict=True):
        np.testing.assert_allclose(x, y, **UNIT_VECTORS)


def test_missing_head_is_an_error_unless_opted_out(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint, tmp_path / "ckpt", without=("colbert_linear.pt",))
    with pytest.raises(MissingHeadError, match="colbert_linear.pt"):
        BGEM3Encoder(path, device="cpu")
    encoder = BGEM3Encoder(path, device="cpu", allow_missing_heads=True)
    out = encoder.encode(TEXTS, return_sparse=True)
    assert out["dense_vecs"].shape == (3, encoder.hidden_size) and len(out["lexical_weights"]) == 3
    with pytest.raises(ValueError, match="colbert_vecs requested"):
        encoder.encode(TEXTS, return_colbert_vecs=True)


def test_shape_mismatch_names_the_tensor_and_both_shapes(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    config["intermediate_size"] = 48
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        WeightPortingError, match=r"encoder\.layer\.0\.intermediate\.dense\.weight.*\(64, 32\).*\(48, 32\)"
    ):
        BGEM3Encoder(path, device="cpu")


def _rewrite_safetensors(path: Path, edit: Any) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_tensor_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _rewrite_safetensors(path, lambda t: t.pop("encoder.layer.1.output.LayerNorm.bias"))
    with pytest.raises(
        WeightPortingError, match=r"missing tensor\(s\) encoder\.layer\.1\.output\.LayerNorm\.bias"
    ):
        BGEM3Encoder(path, device="cpu")


def test_unexpected_tensor_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _rewrite_safetensors(
        path, lambda t: t.update({"encoder.layer.9.extra.weight": np.zeros((2, 3), np.float32)})
    )
    with pytest.raises(
        WeightPortingError, match=r"unexpected tensor.*encoder\.layer\.9\.extra\.weight \(2, 3\)"
    ):
        BGEM3Encoder(path, device="cpu")


def test_roberta_prefixed_keys_are_accepted(tiny_encoder: Any, tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _rewrite_safetensors(path, lambda t: t.update({f"roberta.{k}": t.pop(k) for k in list(t)}))
    _assert_same_weights(BGEM3Encoder(path, device="cpu"), tiny_encoder)


@pytest.mark.parametrize(
    ("setup", "error", "message"),
    [
        (lambda p: p, CheckpointNotFoundError, "does not exist"),
        (lambda p: (p.mkdir(), p)[1], CheckpointNotFoundError, "missing config.json"),
        (lambda p: (p.write_text("x"), p)[1], CheckpointNotFoundError, "not a directory"),
    ],
)
def test_not_a_checkpoint_gives_a_clear_error(tmp_path: Path, setup: Any, error: type, message: str) -> None:
    path = setup(tmp_path / "not_a_checkpoint")
    with pytest.raises(error, match=message):
        BGEM3Encoder(path, device="cpu")


def test_malformed_config_is_named(tiny_checkpoint: Path, tmp_path: Path) -> None:
    path = _copy(tiny_checkpoint, tmp_path / "ckpt")
    (path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        BGEM3Encoder(path, device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": "float8"}, "unknown precision 'float8'"),
        ({"device": "tpu"}, "unknown device 'tpu'"),
        ({"device": "cuda"}, "sees no GPU"),
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"max_tokens_per_batch": 0}, "max_tokens_per_batch must be a positive int or None"),
        ({"query_max_length": 1}, "query_max_length must be an int >= 2"),
    ],
)
def test_bad_constructor_arguments(tiny_checkpoint: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BGEM3Encoder(tiny_checkpoint, **kwargs)


# --------------------------------------------------------------------------- the hub path, offline
def _fake_hf_cache(cache: Path, checkpoint: Path, repo_id: str = "BAAI/bge-m3") -> Path:
    """Lay out `checkpoint` as huggingface_hub's cache would after a download of `repo_id` at main."""
    commit = "0" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(checkpoint, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_hub_id_loads_from_the_cache_offline(
    tiny_encoder: Any, tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "hf_cache"
    _fake_hf_cache(cache, tiny_checkpoint)
    encoder = BGEM3Encoder("BAAI/bge-m3", cache_dir=cache, local_files_only=True, device="cpu")
    _assert_same_weights(encoder, tiny_encoder)


def test_hf_home_and_hf_hub_offline_are_honoured(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """In a fresh process: HF_HOME points at the cache, HF_HUB_OFFLINE=1 forbids the network."""
    import subprocess
    import sys

    _fake_hf_cache(tmp_path / "home" / "hub", tiny_checkpoint)
    code = (
        "from bgem3_embeddings import BGEM3Encoder; e = BGEM3Encoder('BAAI/bge-m3', device='cpu'); "
        "print(e.files.root)"
    )
    env = {**__import__("os").environ, "HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(tmp_path / "home" / "hub") in done.stdout


def test_hub_id_not_in_cache_offline_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"not in the Hugging Face cache .* downloads are off"):
        BGEM3Encoder("BAAI/bge-m3", cache_dir=tmp_path / "empty", local_files_only=True, device="cpu")


def test_unreachable_hub_is_told_apart_from_offline_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Downloads on but the hub unreachable: the message says so instead of blaming offline mode."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(**kwargs: Any) -> str:
        raise LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(CheckpointNotFoundError, match="cannot reach the Hugging Face hub") as info:
        BGEM3Encoder("BAAI/bge-m3", cache_dir=tmp_path / "empty", device="cpu")
    assert "downloads are off" not in str(info.value)


REMOTE_FILES = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "sentencepiece.bpe.model",
    "colbert_linear.pt",
    "sparse_linear.pt",
    "pytorch_model.bin",
    "onnx/model.onnx",
    "onnx/model.onnx_data",
    "onnx/tokenizer.json",
    "imgs/bm25.jpg",
    "README.md",
]


def _fake_snapshot_download(remote: list[str], calls: list[list[str]], root: Path) -> Any:
    """Stands in for the network only: selects files by allow_patterns as huggingface_hub does."""

    def snapshot_download(*, allow_patterns: list[str], **_: Any) -> str:
        calls.append(allow_patterns)
        for name in remote:
            if any(fnmatch.fnmatch(name, pattern) for pattern in allow_patterns):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_text("x")
        return str(root)

    return snapshot_download


@pytest.mark.parametrize("has_safetensors", [True, False])
def test_download_fetches_only_the_needed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, has_safetensors: bool
) -> None:
    import huggingface_hub

    remote = REMOTE_FILES + (["model.safetensors"] if has_safetensors else [])
    calls: list[list[str]] = []
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", _fake_snapshot_download(remote, calls, tmp_path)
    )
    root = download_checkpoint("BAAI/bge-m3")
    fetched = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert not any(name.startswith(("onnx", "imgs")) for name in fetched)
    assert ("pytorch_model.bin" in fetched) is (not has_safetensors)
    assert ("model.safetensors" in fetched) is has_safetensors
    assert {"config.json", "colbert_linear.pt", "sparse_linear.pt", "tokenizer.json"} <= set(fetched)


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_big_tables_are_copied_in_row_blocks(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """The block path (used for the 250002-row table) copies every row, the partial last block too."""
    import tensorflow as tf
    from safetensors.numpy import load_file

    from bgem3_embeddings.checkpoint import porting
    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.loading import build_model

    block = 100
    monkeypatch.setattr(porting, "ROW_BLOCK", block)
    stored = load_file(tiny_checkpoint / "model.safetensors")
    table = next(v for n, v in stored.items() if n.endswith("word_embeddings.weight"))
    assert table.shape[0] > 3 * block and table.shape[0] % block, "needs several blocks and a partial one"
    model, _ = build_model(checkpoint_files_in(tiny_checkpoint), precision=precision)
    ours = model.embeddings.word_embeddings.embeddings.value
    expected = tf.cast(tf.constant(table), ours.dtype)  # the checkpoint's rows, rounded as the policy says
    np.testing.assert_array_equal(tf.cast(ours, tf.float32).numpy(), tf.cast(expected, tf.float32).numpy())
