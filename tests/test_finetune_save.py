"""Saving a fine-tuned model as BAAI ships BGE-M3 (bgem3_embeddings/finetune/save.py, issue 56 item 4).

The tiny checkpoint is loaded, every weight perturbed (so a save is not a copy of the source), saved, and the
folder read back by torch.load(weights_only=True), FlagEmbedding's BGEM3FlagModel and our own encoder. The
folder replaces a previous one only once complete: a full disk mid-save leaves the previous one intact.
"""

from __future__ import annotations

import errno
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings import BGEM3Encoder
from bgem3_embeddings.checkpoint.safetensors_reader import SafetensorsFile
from bgem3_embeddings.checkpoint.torch_pickle import TorchZipFile
from bgem3_embeddings.checkpoint.torch_pickle_writer import ALIGN, write_state_dict
from bgem3_embeddings.finetune import save as save_module
from bgem3_embeddings.finetune.replace_folder import recover_interrupted
from bgem3_embeddings.finetune.save import CheckpointSaveError, save_bgem3_checkpoint
from tests.optional import require_module
from tests.support import run_program, without_modules
from tests.tolerances import SCALED, UNIT_VECTORS

torch = require_module("torch", "torch.load and FlagEmbedding read the saved folder (dev extra)")

TEXTS = [
    "What is BGE M3? 🙂🚀",
    "東京は日本の首都です。北京是中国的首都。",
    "Defination of BM25",
    "BGE M3 supports dense retrieval, lexical matching and multi-vector interaction.",
]
ALL_OUTPUTS = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}


def _encoder(checkpoint: Path) -> Any:
    return BGEM3Encoder(
        checkpoint, precision="float32", device="cpu", weights_cache=False, show_progress=False
    )


def _perturb(model: Any, seed: int) -> None:
    """Every variable moved by noise of a tenth of its spread; the sparse head's bias raised so that most
    tokens keep a lexical weight (the comparison of lexical weights must not be empty)."""
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        value = np.asarray(variable.numpy(), np.float32)
        scale = 0.1 * (float(value.std()) + 0.01)
        variable.assign(value + rng.normal(0.0, scale, value.shape).astype(np.float32))
    model.sparse_linear.bias.assign(model.sparse_linear.bias.numpy() + 1.0)


@pytest.fixture(scope="module")
def tuned(tiny_checkpoint: Path) -> Any:
    """Our encoder on the tiny checkpoint with every weight perturbed (perturbed before its first call)."""
    encoder = _encoder(tiny_checkpoint)
    _perturb(encoder.model, seed=56)
    return encoder


@pytest.fixture(scope="module")
def saved(tuned: Any, tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finetune_save") / "tuned"
    save_bgem3_checkpoint(tuned.model, tiny_checkpoint, out)
    return out


def _assert_same_outputs(got: dict[str, Any], want: dict[str, Any]) -> None:
    """dense, lexical weights and ColBERT vectors of the same texts equal within float32 rounding."""
    np.testing.assert_allclose(got["dense_vecs"], want["dense_vecs"], **UNIT_VECTORS)
    for i, (a, b) in enumerate(zip(got["lexical_weights"], want["lexical_weights"], strict=True)):
        assert a.keys() == b.keys(), f"text {i}: token sets differ: {sorted(a)} vs {sorted(b)}"
        np.testing.assert_allclose([a[k] for k in b], [b[k] for k in b], **SCALED, err_msg=f"text {i}")
    assert sum(map(len, want["lexical_weights"])) > 4, "too few lexical weights for the test to mean much"
    for i, (a, b) in enumerate(zip(got["colbert_vecs"], want["colbert_vecs"], strict=True)):
        assert a.shape == b.shape, f"text {i}: colbert shape {a.shape} vs {b.shape}"
        np.testing.assert_allclose(a, b, **UNIT_VECTORS, err_msg=f"text {i}")


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _siblings(folder: Path) -> list[str]:
    """What an interrupted or failed save could leave beside `folder`."""
    return sorted(p.name for p in folder.parent.glob(f".{folder.name}.*"))


def test_the_folder_has_the_official_layout(saved: Path, tiny_checkpoint: Path) -> None:
    names = {p.name for p in saved.iterdir()}
    assert names == {p.name for p in tiny_checkpoint.iterdir()}  # the tiny checkpoint has BAAI's layout
    for copied in ("config.json", "tokenizer.json", "sentencepiece.bpe.model", "tokenizer_config.json"):
        assert (saved / copied).read_bytes() == (tiny_checkpoint / copied).read_bytes(), copied


def test_heads_load_with_torch_weights_only(saved: Path, tuned: Any) -> None:
    for file_name, layer in (
        ("colbert_linear.pt", tuned.model.colbert_linear),
        ("sparse_linear.pt", tuned.model.sparse_linear),
    ):
        state = torch.load(saved / file_name, weights_only=True)
        assert isinstance(state, OrderedDict) and list(state) == ["weight", "bias"], file_name
        kernel, bias = layer.kernel.numpy(), layer.bias.numpy()  # Keras: [in, out]
        assert state["weight"].dtype == torch.float32 and tuple(state["weight"].shape) == kernel.T.shape
        np.testing.assert_array_equal(state["weight"].numpy(), kernel.T, err_msg=file_name)
        np.testing.assert_array_equal(state["bias"].numpy(), bias, err_msg=file_name)


def test_safetensors_holds_the_sources_names(saved: Path, tiny_checkpoint: Path, tuned: Any) -> None:
    """The same keys as the source (its pooler too, which BGE-M3 does not use: copied), all float32."""
    with (
        SafetensorsFile(saved / "model.safetensors") as ours,
        SafetensorsFile(tiny_checkpoint / "model.safetensors") as source,
    ):
        assert set(ours.infos()) == set(source.infos())
        assert any(name.startswith("pooler.") for name in ours.infos())
        for name, info in ours.infos().items():
            assert info.dtype == np.float32 and info.shape == source.infos()[name].shape, name
        for name in ("pooler.dense.weight", "pooler.dense.bias"):
            np.testing.assert_array_equal(ours.read(name), source.read(name))
        query = tuned.model.encoder_layers[1].query.kernel.numpy()
        np.testing.assert_array_equal(ours.read("encoder.layer.1.attention.self.query.weight"), query.T)
        names = set(ours.infos())
    from safetensors.numpy import load_file  # the safetensors library reads it too

    assert set(load_file(saved / "model.safetensors")) == names


def test_flagembedding_loads_the_folder_and_gives_our_outputs(
    saved: Path, tuned: Any, tiny_checkpoint: Path
) -> None:
    from tests.flagembedding_ref import flagembedding_m3

    ours = tuned.encode(TEXTS, **ALL_OUTPUTS)
    theirs = flagembedding_m3(saved).encode(TEXTS, **ALL_OUTPUTS)
    _assert_same_outputs(theirs, ours)
    # The perturbation shows: the source checkpoint's vectors are far from these.
    source = flagembedding_m3(tiny_checkpoint).encode(TEXTS, return_dense=True)
    assert np.abs(source["dense_vecs"] - ours["dense_vecs"]).max() > 1e-2


def test_our_encoder_loads_the_folder(saved: Path, tuned: Any) -> None:
    _assert_same_outputs(_encoder(saved).encode(TEXTS, **ALL_OUTPUTS), tuned.encode(TEXTS, **ALL_OUTPUTS))


def test_a_lora_model_is_saved_with_its_adapters_merged(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Keras LoRA on an attention projection, an FFN projection and both heads, the adapters non-zero:
    the saved weights are the merged kernels, and FlagEmbedding on them gives the LoRA model's outputs."""
    encoder = _encoder(tiny_checkpoint)
    model = encoder.model
    block = model.encoder_layers[0]
    rng = np.random.default_rng(7)
    adapted = (block.query, block.intermediate, model.colbert_linear, model.sparse_linear)
    for layer in adapted:
        layer.enable_lora(2)
        b = layer.lora_kernel_b
        b.assign(rng.normal(0.0, 0.5, tuple(b.shape)).astype(np.float32))
    model.sparse_linear.bias.assign(model.sparse_linear.bias.numpy() + 1.0)
    merged = {id(layer): layer.kernel.numpy() for layer in adapted}
    for layer in adapted:  # the adapters change the kernel: the test would not tell merged from frozen
        assert np.abs(merged[id(layer)] - layer._kernel.numpy()).max() > 1e-2
    out = tmp_path / "lora"
    save_bgem3_checkpoint(model, tiny_checkpoint, out)

    with SafetensorsFile(out / "model.safetensors") as weights:
        np.testing.assert_array_equal(
            weights.read("encoder.layer.0.attention.self.query.weight"), merged[id(block.query)].T
        )
        np.testing.assert_array_equal(
            weights.read("encoder.layer.0.intermediate.dense.weight"), merged[id(block.intermediate)].T
        )
    with TorchZipFile(out / "colbert_linear.pt") as head:
        np.testing.assert_array_equal(head.read("weight"), merged[id(model.colbert_linear)].T)
    from tests.flagembedding_ref import flagembedding_m3

    _assert_same_outputs(
        flagembedding_m3(out).encode(TEXTS, **ALL_OUTPUTS), encoder.encode(TEXTS, **ALL_OUTPUTS)
    )


def test_bfloat16_weights_are_saved_as_float32(tiny_checkpoint: Path, tmp_path: Path) -> None:
    encoder = BGEM3Encoder(tiny_checkpoint, precision="bfloat16", device="cpu", weights_cache=False)
    out = tmp_path / "bf16"
    save_bgem3_checkpoint(encoder.model, tiny_checkpoint, out)
    kernel = encoder.model.encoder_layers[0].value.kernel
    assert str(kernel.dtype) == "bfloat16"
    with SafetensorsFile(out / "model.safetensors") as weights:
        assert all(info.dtype == np.float32 for info in weights.infos().values())
        saved_kernel = weights.read("encoder.layer.0.attention.self.value.weight")
    np.testing.assert_array_equal(
        saved_kernel, np.asarray(kernel.numpy(), np.float32).T
    )  # bf16 -> f32: exact


# --- the torch-free writer of torch.save files --------------------------------------------------------------
def test_the_pickle_writer_is_read_by_our_reader_and_torch(tmp_path: Path) -> None:
    arrays = {
        "weight": np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5,
        "bias": np.array([1.5, -2.0, 3.25], np.float32),
        "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not C-contiguous: written as one
        "big_endian": np.arange(4, dtype=">f4"),
        "half": np.linspace(-1, 1, 70_000).astype(np.float16),  # over 64 KB: BININT sizes
        "ids": np.arange(5, dtype=np.int64)[None],
        "scalar": np.array(2.5),
        "one_row": np.ones((1, 3), np.float32),
    }
    path = tmp_path / "heads.pt"
    with open(path, "wb") as out:
        write_state_dict(out, arrays, archive_name="heads")
    with TorchZipFile(path) as ours:
        assert set(ours.infos()) == set(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(ours.read(name), array, err_msg=name)
    for mmap in (False, True):
        state = torch.load(path, weights_only=True, mmap=mmap)
        assert list(state) == list(arrays)
        for name, array in arrays.items():
            assert tuple(state[name].shape) == array.shape and state[name].is_contiguous(), name
            np.testing.assert_array_equal(state[name].numpy(), array, err_msg=name)
    with zipfile.ZipFile(path) as archive:  # storages start 64-byte aligned in the file, as torch puts them
        for info in archive.infolist():
            if "/data/" in info.filename:
                start = info.header_offset + 30 + len(info.filename) + len(info.extra)
                assert start % ALIGN == 0, info.filename


def test_saving_needs_no_torch(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A user's install without torch saves a folder torch then loads."""
    code = (
        "import sys; from pathlib import Path; from bgem3_embeddings import BGEM3Encoder\n"
        "from bgem3_embeddings.finetune.save import save_bgem3_checkpoint\n"
        "source, out = Path(sys.argv[1]), Path(sys.argv[2])\n"
        "encoder = BGEM3Encoder(source, precision='float32', device='cpu', weights_cache=False)\n"
        "save_bgem3_checkpoint(encoder.model, source, out)\n"
        "assert 'torch' not in sys.modules\n"
    )
    out = tmp_path / "no_torch"
    done = run_program(code, str(tiny_checkpoint), str(out), env=without_modules(tmp_path / "stubs", "torch"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(torch.load(out / "sparse_linear.pt", weights_only=True)) == ["weight", "bias"]


# --- atomic replacement -------------------------------------------------------------------------------------
def test_a_full_disk_mid_save_leaves_the_previous_checkpoint(
    tuned: Any, tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "ckpt"
    save_bgem3_checkpoint(tuned.model, tiny_checkpoint, out)
    before = _files(out)
    seen: list[str] = []

    def disk_fills(file: Any, *args: Any, **kwargs: Any) -> None:
        seen.extend(p.name for p in tmp_path.glob(".ckpt.partial-*/*"))  # model.safetensors is written
        file.write(b"PK\x03\x04 a few bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_module, "write_state_dict", disk_fills)
    with pytest.raises(CheckpointSaveError) as caught:
        save_bgem3_checkpoint(tuned.model, tiny_checkpoint, out)
    message = str(caught.value)
    assert "model.safetensors" in seen, "the failure must come mid-save, after the weights file"
    assert "\n" not in message
    assert "No space left on device" in message and "colbert_linear.pt" in message
    assert f"the last complete checkpoint in {out} is untouched" in message
    assert _files(out) == before
    assert _siblings(out) == []


def test_a_failed_first_save_leaves_nothing(
    tuned: Any, tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_module, "write_safetensors", disk_full)
    out = tmp_path / "first"
    with pytest.raises(CheckpointSaveError, match="writing model.safetensors failed"):
        save_bgem3_checkpoint(tuned.model, tiny_checkpoint, out)
    assert not out.exists() and _siblings(out) == []


def test_a_new_save_replaces_the_previous_one_whole(
    tuned: Any, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ckpt"
    source = _encoder(tiny_checkpoint)
    save_bgem3_checkpoint(source.model, tiny_checkpoint, out)
    first = _files(out)
    (out / "stale.txt").write_text("from the previous checkpoint")
    save_bgem3_checkpoint(tuned.model, tiny_checkpoint, out)
    second = _files(out)
    assert "stale.txt" not in second and second.keys() == first.keys()
    assert second["model.safetensors"] != first["model.safetensors"]
    assert _siblings(out) == []


def test_a_folder_holding_something_else_is_refused(
    tuned: Any, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "notes"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(CheckpointSaveError, match="holds something other than a model checkpoint"):
        save_bgem3_checkpoint(tuned.model, tiny_checkpoint, out)
    assert _files(out) == {"thesis.tex": b"years of work"} and _siblings(out) == []
    save_bgem3_checkpoint(tuned.model, tiny_checkpoint, out, overwrite=True)
    assert (out / "model.safetensors").is_file() and not (out / "thesis.tex").exists()


def test_a_kill_between_the_renames_is_recovered(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Killed after moving the previous checkpoint aside and before renaming the new one into place: the next
    save (or `recover_interrupted`) renames the previous one back; a killed writer's partial folder goes."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    pid = int(dead.stdout)  # a process that has exited
    out = tmp_path / "ckpt"
    previous, partial = tmp_path / f".ckpt.previous-{pid}", tmp_path / f".ckpt.partial-{pid}"
    previous.mkdir()
    (previous / "config.json").write_text("{}")
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    recover_interrupted(out)
    assert _files(out) == {"config.json": b"{}"} and _siblings(out) == []
