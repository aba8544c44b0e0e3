"""Read torch.save files (zip format, torch >= 1.6) without torch, and without running code from them.

A torch.save zip holds `<archive>/data.pkl` (a pickle of the state dict) and one member
`<archive>/data/<key>` of raw bytes per storage. The pickle is unpickled by `RestrictedUnpickler`,
whose `find_class` returns local stand-ins for the handful of globals a state dict of tensors uses
(see `_ALLOWED_GLOBALS`) and raises `UnsafePickleError` for every other global: a global is the only
way a pickle can reach code, so nothing from the file ever executes. Tensors become `TensorRef`
descriptors; `TorchZipFile.read` then seeks to the storage member inside the zip and reads only the
bytes it needs.

The legacy (pre-1.6, non-zip) format is refused with a clear error.
"""

from __future__ import annotations

import _compat_pickle
import io
import logging
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bgem3_embeddings.checkpoint.tensor_source import (
    CheckpointFormatError,
    FileTensorSource,
    TensorInfo,
    bfloat16_to_float32,
    row_range,
)

logger = logging.getLogger(__name__)

# torch.save's legacy format starts with a pickled magic number.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_ZIP_LOCAL_HEADER = struct.Struct("<4s5H3I2H")  # signature ... file name length, extra field length


class UnsafePickleError(CheckpointFormatError):
    """The pickle references a global outside the allow-list (it could run code); nothing was run."""


def _refuse_setstate(self: Any, state: Any) -> None:
    """__setstate__ of every object the pickle can reach: its BUILD opcode may not modify them."""
    raise CheckpointFormatError(f"the pickle tried to modify a {type(self).__name__}; not a weights file")


@dataclass(frozen=True, slots=True)
class _StorageType:
    """Stand-in for torch.<X>Storage: only names the element dtype. Not callable."""

    name: str
    dtype: np.dtype  # stored dtype, little-endian unless the archive says otherwise
    bfloat16: bool = False

    __setstate__ = _refuse_setstate


_STORAGE_TYPES: dict[str, _StorageType] = {
    name: _StorageType(name, np.dtype(code), name == "BFloat16Storage")
    for name, code in {
        "DoubleStorage": "<f8",
        "FloatStorage": "<f4",
        "HalfStorage": "<f2",
        "BFloat16Storage": "<u2",
        "LongStorage": "<i8",
        "IntStorage": "<i4",
        "ShortStorage": "<i2",
        "CharStorage": "i1",
        "ByteStorage": "u1",
        "BoolStorage": "?",
    }.items()
}


@dataclass(frozen=True, slots=True)
class StorageRef:
    """A storage named by a persistent id: the zip member data/<key> holding `numel` elements."""

    key: str
    storage_type: _StorageType
    numel: int

    __setstate__ = _refuse_setstate


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor as pickled: a view (offset, shape, stride, in elements) into a storage. Holds no data."""

    storage: StorageRef
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    __setstate__ = _refuse_setstate

    @property
    def is_c_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size > 1 and stride != expected:  # the stride of a size-1 dim is irrelevant
                return False
            expected *= size
        return True


def _int_tuple(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple | list) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise CheckpointFormatError(f"tensor {what} must be a tuple of non-negative ints, got {value!r}")
    return tuple(value)


def _rebuild_tensor_v2(
    storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any = False, *_: Any
) -> TensorRef:
    """Stand-in for torch._utils._rebuild_tensor_v2: records the view, reads nothing.

    Trailing arguments (backward_hooks, metadata) are ignored.
    """
    if not isinstance(storage, StorageRef):
        raise CheckpointFormatError(f"tensor storage must be a persistent storage id, got {type(storage)}")
    if not isinstance(offset, int) or offset < 0:
        raise CheckpointFormatError(f"tensor storage offset must be a non-negative int, got {offset!r}")
    shape, strides = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if len(shape) != len(strides):
        raise CheckpointFormatError(f"tensor size {shape} and stride {strides} differ in length")
    return TensorRef(storage, offset, shape, strides)


def _rebuild_parameter(data: Any, requires_grad: Any = False, *_: Any) -> Any:
    """Stand-in for torch._utils._rebuild_parameter(_with_state): a Parameter is its tensor here."""
    if not isinstance(data, TensorRef):
        raise CheckpointFormatError(f"parameter data must be a tensor, got {type(data)}")
    return data


@dataclass(frozen=True, slots=True)
class _StandIn:
    """A callable the pickle may reduce with. Immutable, unlike a bare function, whose attributes
    (__defaults__, ...) the pickle's BUILD opcode could otherwise change for later loads."""

    fn: Callable[..., Any]

    __setstate__ = _refuse_setstate

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


# module -> name -> what find_class returns. Everything else is refused. All values are immutable.
_ALLOWED_GLOBALS: dict[str, dict[str, Any]] = {
    "collections": {"OrderedDict": OrderedDict},  # a builtin, immutable type
    "torch._utils": {
        "_rebuild_tensor_v2": _StandIn(_rebuild_tensor_v2),
        "_rebuild_parameter": _StandIn(_rebuild_parameter),
        "_rebuild_parameter_with_state": _StandIn(_rebuild_parameter),
    },
    "torch": dict(_STORAGE_TYPES),
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only allow-listed globals, to inert local stand-ins."""

    def __init__(self, data: bytes, source: str) -> None:
        super().__init__(io.BytesIO(data))
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        # Protocols < 3 may carry Python 2 names (__builtin__.exec): resolve them as pickle does, so the
        # error names the global that would really have been called.
        pickled = f"{module}.{name}"
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        allowed = _ALLOWED_GLOBALS.get(module, {})
        if name in allowed:
            return allowed[name]
        alias = "" if pickled == f"{module}.{name}" else f" (pickled as '{pickled}')"
        raise UnsafePickleError(
            f"{self.source}: refused to load global '{module}.{name}'{alias}: a weights file needs only "
            "tensors and dicts, and this global could run code. The file was not loaded; nothing in it ran."
        )

    def persistent_load(self, pid: Any) -> StorageRef:
        # New-style torch.save: ('storage', storage_type, key, location, numel).
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise CheckpointFormatError(f"{self.source}: unsupported persistent id {pid!r}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType):
            raise CheckpointFormatError(f"{self.source}: unsupported storage type {storage_type!r}")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise CheckpointFormatError(f"{self.source}: malformed storage id {pid!r}")
        return StorageRef(key, storage_type, numel)


def restricted_loads(data: bytes, source: str) -> Any:
    """Unpickle `data` with only the allow-listed globals; any failure becomes a CheckpointFormatError."""
    try:
        return RestrictedUnpickler(data, source).load()
    except CheckpointFormatError:
        raise
    except Exception as e:  # malformed opcodes, wrong argument types for the stand-ins, ...
        raise CheckpointFormatError(f"{source}: cannot unpickle the checkpoint: {e!r}") from e


def _flatten_state_dict(obj: Any, source: str, prefix: str = "") -> dict[str, TensorRef]:
    """Name -> tensor of a (possibly nested) mapping of tensors; non-tensor leaves are skipped."""
    if not isinstance(obj, Mapping):
        raise CheckpointFormatError(f"{source}: expected a state dict of tensors, got {type(obj).__name__}")
    tensors: dict[str, TensorRef] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, TensorRef):
            tensors[name] = value
        elif isinstance(value, Mapping):
            tensors.update(_flatten_state_dict(value, source, f"{name}."))
        else:
            logger.debug("%s: skipping non-tensor entry %r", source, name)
    return tensors


class TorchZipFile(FileTensorSource):
    """A torch.save zip file (pytorch_model.bin, colbert_linear.pt, sparse_linear.pt) as a TensorSource."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        try:
            self._tensors, self._members = self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> tuple[dict[str, TensorRef], dict[str, tuple[int, int]]]:
        if not zipfile.is_zipfile(self.path):
            self._refuse_non_zip()
        try:
            with zipfile.ZipFile(self.path) as archive:
                infos = archive.infolist()
                pkl = [i for i in infos if i.filename == "data.pkl" or i.filename.endswith("/data.pkl")]
                if len(pkl) != 1:
                    raise CheckpointFormatError(
                        f"{self.path}: zip has no single data.pkl: not a torch.save file"
                    )
                prefix = pkl[0].filename[: -len("data.pkl")]
                byteorder = "little"
                if f"{prefix}byteorder" in archive.namelist():
                    byteorder = archive.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
                pickled = archive.read(pkl[0])
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise CheckpointFormatError(f"{self.path}: corrupt or truncated zip archive: {e}") from e
        if byteorder not in ("little", "big"):
            raise CheckpointFormatError(f"{self.path}: unknown byteorder {byteorder!r}")
        self._byteorder: Literal["<", ">"] = "<" if byteorder == "little" else ">"

        tensors = _flatten_state_dict(restricted_loads(pickled, str(self.path)), str(self.path))
        by_name = {i.filename: i for i in infos}
        members: dict[str, tuple[int, int]] = {}
        for name, ref in tensors.items():
            key = ref.storage.key
            if key not in members:
                member = by_name.get(f"{prefix}data/{key}")
                if member is None:
                    raise CheckpointFormatError(
                        f"{self.path}: storage data/{key} of tensor {name!r} is missing"
                    )
                members[key] = (self._member_data_offset(member), member.file_size)
            self._check_bounds(name, ref, members[key][1])
        return tensors, members

    def _refuse_non_zip(self) -> None:
        """Not a zip: say whether it is legacy torch.save (unsupported) or not a torch file at all."""
        with open(self.path, "rb") as f:
            head = f.read(1 << 16)
        # The legacy format starts with a pickled magic number. Unpickling the first object with the
        # restricted unpickler is safe, and tells a hostile pickle apart from an old torch file.
        try:
            first: Any = RestrictedUnpickler(head, str(self.path)).load()
        except UnsafePickleError:
            raise
        except Exception:  # truncated, or not a pickle at all: the generic error below
            first = None
        if first == _LEGACY_MAGIC:
            raise CheckpointFormatError(
                f"{self.path}: legacy (pre-1.6, non-zip) torch.save format is not supported; re-save it with "
                "torch>=1.6: torch.save(torch.load(path, weights_only=True), path)"
            )
        raise CheckpointFormatError(f"{self.path}: not a torch.save zip archive (corrupt or truncated?)")

    def _member_data_offset(self, member: zipfile.ZipInfo) -> int:
        """Absolute offset of a stored (uncompressed) zip member's bytes, from its local header."""
        if member.compress_type != zipfile.ZIP_STORED or member.flag_bits & 0x1:
            raise CheckpointFormatError(
                f"{self.path}: zip member {member.filename} is compressed or encrypted"
            )
        header = np.empty(_ZIP_LOCAL_HEADER.size, dtype=np.uint8)
        self._read_into(member.header_offset, header, f"zip header of {member.filename}")
        fields = _ZIP_LOCAL_HEADER.unpack(header.tobytes())
        if fields[0] != b"PK\x03\x04":
            raise CheckpointFormatError(f"{self.path}: bad zip local header for {member.filename}")
        name_len, extra_len = fields[-2], fields[-1]
        offset = member.header_offset + _ZIP_LOCAL_HEADER.size + name_len + extra_len
        if offset + member.file_size > self.file_size:
            raise CheckpointFormatError(
                f"{self.path}: zip member {member.filename} runs past the end of file"
            )
        return offset

    def _check_bounds(self, name: str, ref: TensorRef, member_size: int) -> None:
        itemsize = ref.storage.storage_type.dtype.itemsize
        if ref.storage.numel * itemsize != member_size:
            raise CheckpointFormatError(
                f"{self.path}: storage data/{ref.storage.key} holds {member_size} bytes, expected "
                f"{ref.storage.numel} x {itemsize}"
            )
        numel = int(np.prod(ref.shape, dtype=np.int64))
        if numel and ref.offset + numel > ref.storage.numel:
            raise CheckpointFormatError(
                f"{self.path}: tensor {name!r} (offset {ref.offset}, shape {ref.shape}) overruns its "
                f"storage of {ref.storage.numel} elements"
            )

    def infos(self) -> dict[str, TensorInfo]:
        return {
            name: TensorInfo(name, ref.shape, self._out_dtype(ref)) for name, ref in self._tensors.items()
        }

    @staticmethod
    def _out_dtype(ref: TensorRef) -> np.dtype:
        st = ref.storage.storage_type
        return np.dtype(np.float32) if st.bfloat16 else st.dtype.newbyteorder("=")

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        if name not in self._tensors:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        ref = self._tensors[name]
        if not ref.is_c_contiguous:
            raise CheckpointFormatError(
                f"{self.path}: tensor {name!r} is not contiguous (shape {ref.shape}, stride {ref.stride}); "
                "re-save it with tensor.contiguous()"
            )
        start, stop = row_range(name, ref.shape, rows)
        st = ref.storage.storage_type
        stored = st.dtype.newbyteorder(self._byteorder) if st.dtype.itemsize > 1 else st.dtype
        row_items = int(np.prod(ref.shape[1:], dtype=np.int64))
        shape = (stop - start, *ref.shape[1:]) if ref.shape else ()
        out = np.empty(shape, dtype=stored)
        data_offset, _ = self._members[ref.storage.key]
        offset = data_offset + (ref.offset + start * row_items) * stored.itemsize
        self._read_into(offset, out, f"tensor {name!r}")
        if st.bfloat16:
            return bfloat16_to_float32(out.astype("=u2", copy=False))
        return out if out.dtype.isnative else out.astype(out.dtype.newbyteorder("="))
