"""The torch-free checkpoint readers against the reference libraries, and their refusals."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings.checkpoint.open_weights import open_tensor_source
from bgem3_embeddings.checkpoint.safetensors_reader import SafetensorsFile
from bgem3_embeddings.checkpoint.tensor_source import CheckpointFormatError, ShardedTensorSource, TensorSource
from bgem3_embeddings.checkpoint.torch_pickle import TorchZipFile, UnsafePickleError
from tests.optional import require_module

torch = require_module("torch")
safetensors_numpy = require_module("safetensors.numpy")
safetensors_torch = require_module("safetensors.torch")

REPO_ROOT = Path(__file__).resolve().parents[1]
HEADS = ("colbert_linear.pt", "sparse_linear.pt")


def _as_numpy(t: Any) -> np.ndarray:
    """A torch tensor as the readers return it (bfloat16 widened to float32)."""
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _assert_same(source: TensorSource, expected: dict[str, np.ndarray]) -> None:
    infos = source.infos()
    assert set(infos) == set(expected)
    for name, want in expected.items():
        got = source.read(name)
        assert infos[name].shape == want.shape == got.shape, name
        assert infos[name].dtype == want.dtype == got.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


# --- agreement with the reference libraries -----------------------------------------------------------


def test_safetensors_matches_library(tiny_checkpoint: Path) -> None:
    path = tiny_checkpoint / "model.safetensors"
    expected = safetensors_numpy.load_file(path)
    assert "embeddings.word_embeddings.weight" in expected and "pooler.dense.weight" in expected
    assert not any(name.startswith("roberta.") for name in expected)
    with open_tensor_source(path) as source:
        assert isinstance(source, SafetensorsFile)
        _assert_same(source, expected)


@pytest.mark.parametrize("file_name", ["pytorch_model.bin", *HEADS])
def test_torch_reader_matches_torch_load(tiny_checkpoint_pt: Path, file_name: str) -> None:
    path = tiny_checkpoint_pt / file_name
    expected = {k: _as_numpy(v) for k, v in torch.load(path, weights_only=True).items()}
    with open_tensor_source(path) as source:
        assert isinstance(source, TorchZipFile)
        _assert_same(source, expected)


def test_head_shapes(tiny_checkpoint: Path) -> None:
    hidden = json.loads((tiny_checkpoint / "config.json").read_text())["hidden_size"]
    with open_tensor_source(tiny_checkpoint / "colbert_linear.pt") as colbert:
        assert {n: i.shape for n, i in colbert.infos().items()} == {
            "weight": (hidden, hidden),
            "bias": (hidden,),
        }
    with open_tensor_source(tiny_checkpoint / "sparse_linear.pt") as sparse:
        assert {n: i.shape for n, i in sparse.infos().items()} == {"weight": (1, hidden), "bias": (1,)}


def test_both_formats_hold_the_same_weights(tiny_checkpoint: Path, tiny_checkpoint_pt: Path) -> None:
    assert not (tiny_checkpoint / "pytorch_model.bin").exists()
    assert not (tiny_checkpoint_pt / "model.safetensors").exists()
    with open_tensor_source(tiny_checkpoint) as st, open_tensor_source(tiny_checkpoint_pt) as pt:
        assert isinstance(st, SafetensorsFile) and isinstance(pt, TorchZipFile)
        _assert_same(pt, {name: st.read(name) for name in st.infos()})


def test_dtypes_views_and_scalars(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 7
    tensors = {
        "f32": base,
        "f16": base.half(),
        "bf16": base.to(torch.bfloat16),
        "f64": base.double(),
        "i64": torch.arange(10),
        "i32": torch.arange(10, dtype=torch.int32),
        "u8": torch.arange(10, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }
    views = {"rows_view": base[2:5], "shared": base}  # a view at a storage offset, sharing storage
    torch.save({**tensors, **views}, tmp_path / "t.pt")
    safetensors_torch.save_file(tensors, tmp_path / "t.safetensors")
    expected = {k: _as_numpy(v) for k, v in tensors.items()}
    assert expected["bf16"].dtype == np.float32
    with open_tensor_source(tmp_path / "t.safetensors") as source:
        _assert_same(source, expected)
    with open_tensor_source(tmp_path / "t.pt") as source:
        _assert_same(source, {**expected, **{k: v.numpy() for k, v in views.items()}})
        np.testing.assert_array_equal(source.read("rows_view", slice(1, 3)), base[3:5].numpy())


def test_non_contiguous_tensor_is_a_clear_error(tmp_path: Path) -> None:
    torch.save({"t": torch.arange(12.0).reshape(3, 4).t()}, tmp_path / "t.pt")
    with open_tensor_source(tmp_path / "t.pt") as source:
        assert source.infos()["t"].shape == (4, 3)
        with pytest.raises(CheckpointFormatError, match=r"t\.pt.*'t' is not contiguous"):
            source.read("t")


# --- row ranges ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows", [slice(0, 10), slice(5, None), slice(None, 3), slice(-3, None), slice(10, 5), slice(0, 10**9)]
)
def test_row_range_reads(tiny_checkpoint: Path, tiny_checkpoint_pt: Path, rows: slice) -> None:
    name = "embeddings.word_embeddings.weight"
    full = safetensors_numpy.load_file(tiny_checkpoint / "model.safetensors")[name]
    for path in (tiny_checkpoint / "model.safetensors", tiny_checkpoint_pt / "pytorch_model.bin"):
        with open_tensor_source(path) as source:
            got = source.read(name, rows)
            assert got.flags.c_contiguous and got.flags.owndata  # a fresh array, not a view of a big one
            np.testing.assert_array_equal(got, full[rows])


def test_row_range_rejects_steps_and_scalars(tmp_path: Path, tiny_checkpoint: Path) -> None:
    with open_tensor_source(tiny_checkpoint / "model.safetensors") as source:
        with pytest.raises(ValueError, match="step 1"):
            source.read("embeddings.word_embeddings.weight", slice(0, 10, 2))
        with pytest.raises(KeyError, match="no tensor named 'nope'"):
            source.read("nope")
    torch.save({"s": torch.tensor(1.0)}, tmp_path / "s.pt")
    with open_tensor_source(tmp_path / "s.pt") as source, pytest.raises(ValueError, match="scalar"):
        source.read("s", slice(0, 1))


# --- sharded checkpoints and dispatch -----------------------------------------------------------------


def _write_shards(tiny_checkpoint: Path, out: Path) -> dict[str, np.ndarray]:
    tensors = safetensors_numpy.load_file(tiny_checkpoint / "model.safetensors")
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2]}
    shards["model-00002-of-00002.safetensors"] = names[len(names) // 2 :]
    weight_map = {}
    for shard, shard_names in shards.items():
        safetensors_numpy.save_file({n: tensors[n] for n in shard_names}, out / shard)
        weight_map.update(dict.fromkeys(shard_names, shard))
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    return tensors


def test_sharded_safetensors(tmp_path: Path, tiny_checkpoint: Path) -> None:
    expected = _write_shards(tiny_checkpoint, tmp_path)
    with open_tensor_source(tmp_path / "model.safetensors.index.json") as source:
        assert isinstance(source, ShardedTensorSource)
        _assert_same(source, expected)
        np.testing.assert_array_equal(
            source.read("embeddings.word_embeddings.weight", slice(3, 9)),
            expected["embeddings.word_embeddings.weight"][3:9],
        )
    with open_tensor_source(tmp_path) as source:  # a directory: finds the index
        assert isinstance(source, ShardedTensorSource)


def test_sharded_torch_bins(tmp_path: Path, tiny_checkpoint_pt: Path) -> None:
    state = torch.load(tiny_checkpoint_pt / "pytorch_model.bin", weights_only=True)
    names = list(state)
    weight_map = {}
    for i, part in enumerate((names[:10], names[10:])):
        shard = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({n: state[n] for n in part}, tmp_path / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with open_tensor_source(tmp_path) as source:
        assert isinstance(source, ShardedTensorSource)
        _assert_same(source, {k: v.numpy() for k, v in state.items()})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.update({"ghost": next(iter(m.values()))}), "'ghost' is mapped to shard"),
        (lambda m: m.update({"x": "../outside.safetensors"}), "outside the checkpoint folder"),
        (lambda m: m.update({"x": "missing.safetensors"}), "missing.safetensors"),
    ],
)
def test_sharded_index_errors(tmp_path: Path, tiny_checkpoint: Path, edit: Any, message: str) -> None:
    _write_shards(tiny_checkpoint, tmp_path)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    edit(index["weight_map"])
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointFormatError, match=message):
        open_tensor_source(index_path)
    index_path.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointFormatError, match="weight_map"):
        open_tensor_source(index_path)


def test_dispatch_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointFormatError, match="does not exist"):
        open_tensor_source(tmp_path / "model.safetensors")
    (tmp_path / "weights.h5").write_bytes(b"x")
    with pytest.raises(CheckpointFormatError, match=r"weights\.h5: unknown checkpoint file type"):
        open_tensor_source(tmp_path / "weights.h5")
    with pytest.raises(CheckpointFormatError, match="no encoder weights found"):
        open_tensor_source(tmp_path)


# --- corrupt and truncated files ----------------------------------------------------------------------


def _safetensors_bytes(header: dict[str, Any], data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short"),
        ((10**12).to_bytes(8, "little") + b"{}", "exceeds the file size"),
        ((4).to_bytes(8, "little") + b"{no}", "not valid JSON"),
        (_safetensors_bytes([]), "not a JSON object"),  # type: ignore[arg-type]
        (_safetensors_bytes({"a": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}}, b"x"), "dtype"),
        (
            _safetensors_bytes({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"x" * 4),
            "shape",
        ),
        (
            _safetensors_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"x" * 4),
            "need 8",
        ),
        (
            _safetensors_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"x" * 8),
            "offsets",
        ),
        (
            _safetensors_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"x" * 7),
            "truncated",
        ),
    ],
)
def test_corrupt_safetensors(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointFormatError, match=message) as info:
        open_tensor_source(path)
    assert str(path) in str(info.value)


def test_truncated_safetensors_checkpoint(tmp_path: Path, tiny_checkpoint: Path) -> None:
    data = (tiny_checkpoint / "model.safetensors").read_bytes()
    path = tmp_path / "model.safetensors"
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointFormatError, match="truncated") as info:
        open_tensor_source(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_torch_checkpoint(tmp_path: Path, tiny_checkpoint_pt: Path, keep: float) -> None:
    data = (tiny_checkpoint_pt / "pytorch_model.bin").read_bytes()
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointFormatError) as info:
        open_tensor_source(path)
    assert str(path) in str(info.value)


def test_garbage_and_wrong_contents(tmp_path: Path) -> None:
    (tmp_path / "garbage.pt").write_bytes(os.urandom(1000))
    with pytest.raises(CheckpointFormatError, match=r"garbage\.pt: not a torch\.save zip"):
        open_tensor_source(tmp_path / "garbage.pt")
    torch.save(torch.zeros(3), tmp_path / "bare_tensor.pt")  # a tensor, not a state dict
    with pytest.raises(CheckpointFormatError, match="expected a state dict"):
        open_tensor_source(tmp_path / "bare_tensor.pt")
    with zipfile.ZipFile(tmp_path / "no_pickle.bin", "w") as z:
        z.writestr("archive/other.txt", "hi")
    with pytest.raises(CheckpointFormatError, match="no single data.pkl"):
        open_tensor_source(tmp_path / "no_pickle.bin")


def test_missing_storage_member(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2, 2)}, tmp_path / "full.pt")
    with zipfile.ZipFile(tmp_path / "full.pt") as src, zipfile.ZipFile(tmp_path / "cut.pt", "w") as dst:
        for info in src.infolist():
            if "/data/" not in info.filename:
                dst.writestr(info.filename.replace("full/", "cut/"), src.read(info))
    with pytest.raises(CheckpointFormatError, match=r"cut\.pt: storage data/0 of tensor 'w' is missing"):
        open_tensor_source(tmp_path / "cut.pt")


def test_legacy_torch_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(
        CheckpointFormatError, match=r"pytorch_model\.bin: legacy .*re-save it with torch>=1\.6"
    ):
        open_tensor_source(path)


# --- malicious pickles --------------------------------------------------------------------------------


class _Payload:
    """Unpickling this calls `func(*args)`: the classic pickle attack."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


def _payloads(marker: Path) -> dict[str, _Payload]:
    """Each writes `marker` when run; keyed by the global the pickle names (module.name)."""
    code = f"open({str(marker)!r}, 'w').write('pwned')"
    return {
        f"{os.system.__module__}.system": _Payload(os.system, f"touch {marker}"),
        "builtins.exec": _Payload(exec, code),
        "builtins.eval": _Payload(eval, code),
        "subprocess.call": _Payload(subprocess.call, ["touch", str(marker)]),
    }


def _torch_zip(path: Path, pickled: bytes) -> None:
    """A zip with torch.save's layout around an arbitrary data.pkl (no torch needed)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickled)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")


@pytest.mark.parametrize("global_name", ["posix.system", "builtins.exec", "builtins.eval", "subprocess.call"])
@pytest.mark.parametrize("how", ["torch.save", "zip", "nested", "legacy", "legacy_protocol0"])
def test_malicious_pickle_is_refused(tmp_path: Path, global_name: str, how: str) -> None:
    marker = tmp_path / "marker"
    payloads = _payloads(marker)
    if global_name not in payloads:
        pytest.skip(f"{global_name} does not exist on this platform")
    payload = payloads[global_name]
    path = tmp_path / "pytorch_model.bin"
    if how == "torch.save":  # what an attacker would publish: torch.save of a state dict with a payload
        torch.save({"weight": torch.ones(2), "bias": payload}, path)
    elif how == "zip":
        _torch_zip(path, pickle.dumps(payload, protocol=2))
    elif how == "nested":
        _torch_zip(path, pickle.dumps({"a": {"b": [payload]}}, protocol=4))
    elif how == "legacy":  # a plain pickle file, as the pre-1.6 format is
        path.write_bytes(pickle.dumps(payload, protocol=2))
    else:
        path.write_bytes(pickle.dumps(payload, protocol=0))

    with pytest.raises(UnsafePickleError, match=rf"refused to load global '{global_name}'") as info:
        open_tensor_source(path)
    assert str(path) in str(info.value)
    assert not marker.exists()


def test_pickle_cannot_modify_the_stand_ins(tmp_path: Path) -> None:
    # GLOBAL torch.FloatStorage; BUILD it with new field values; STOP. A shared stand-in changed this way
    # would corrupt later loads, so BUILD on any stand-in must fail.
    crafted = b"\x80\x02ctorch\nFloatStorage\n(X\x04\x00\x00\x00evilK\x08\x88tb."
    _torch_zip(tmp_path / "evil.pt", crafted)
    with pytest.raises(CheckpointFormatError, match="tried to modify"):
        open_tensor_source(tmp_path / "evil.pt")
    torch.save({"w": torch.ones(3)}, tmp_path / "good.pt")
    with open_tensor_source(tmp_path / "good.pt") as source:
        np.testing.assert_array_equal(source.read("w"), np.ones(3, np.float32))


# --- no torch -----------------------------------------------------------------------------------------

_NO_TORCH_SCRIPT = """
import sys
sys.modules["torch"] = None  # any "import torch" now raises ImportError
import numpy as np
from bgem3_embeddings.checkpoint.open_weights import open_tensor_source
from bgem3_embeddings.checkpoint.torch_pickle import UnsafePickleError

out = {}
for path in sys.argv[2:]:
    with open_tensor_source(path) as source:
        for name in source.infos():
            out[path + ":" + name] = source.read(name)
np.savez(sys.argv[1], **out)
assert sys.modules["torch"] is None
"""


def test_readers_work_without_torch(tmp_path: Path, tiny_checkpoint: Path, tiny_checkpoint_pt: Path) -> None:
    paths = [tiny_checkpoint / "model.safetensors", tiny_checkpoint_pt / "pytorch_model.bin"]
    paths += [tiny_checkpoint_pt / head for head in HEADS]
    out = tmp_path / "tensors.npz"
    subprocess.run(
        [sys.executable, "-c", _NO_TORCH_SCRIPT, str(out), *map(str, paths)], check=True, cwd=REPO_ROOT
    )
    with np.load(out) as got:
        for path in paths[1:]:
            for name, tensor in torch.load(path, weights_only=True).items():
                np.testing.assert_array_equal(got[f"{path}:{name}"], tensor.numpy())
        assert len(got.files) == 2 * len(torch.load(paths[1], weights_only=True)) + 4
