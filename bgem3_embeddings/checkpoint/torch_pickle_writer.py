"""Write torch.save's zip format without torch: a state dict of numpy arrays that `torch.load(path,
weights_only=True)` and our own reader (`torch_pickle.TorchZipFile`) both read.

The layout is the one torch 2.x writes (checked against torch 2.13's own output):

    <archive>/data.pkl            protocol-2 pickle of an OrderedDict of tensors
    <archive>/.format_version     b"1"
    <archive>/.storage_alignment  b"64"
    <archive>/byteorder           b"little"
    <archive>/data/<N>            the raw bytes of storage N, 64-byte aligned in the file
    <archive>/version             b"3\\n"

Every member is stored (uncompressed). The pickle is written opcode by opcode rather than with `pickle`:
its globals (`torch._utils._rebuild_tensor_v2`, `torch.FloatStorage`) name torch's functions, which
`pickle` would import to check. Each tensor is `_rebuild_tensor_v2(storage, 0, size, stride, False,
OrderedDict())`, its storage the persistent id `("storage", torch.<X>Storage, "<N>", "cpu", numel)`, as
torch.save pickles a contiguous CPU tensor; nothing else appears, so the file passes both allow-lists.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Mapping
from typing import BinaryIO

import numpy as np

from bgem3_embeddings.checkpoint.torch_pickle import _STORAGE_TYPES

ALIGN = 64  # torch aligns storages so that torch.load(mmap=True) can map them
_RECORDS_AFTER_DATA = {"version": b"3\n"}
_RECORDS_BEFORE_DATA = {
    ".format_version": b"1",
    ".storage_alignment": str(ALIGN).encode(),
    "byteorder": b"little",
}
# numpy dtype -> torch storage class name: the reader's own table read backwards (numpy has no bfloat16).
_STORAGE_NAMES = {st.dtype.newbyteorder("<"): name for name, st in _STORAGE_TYPES.items() if not st.bfloat16}
_PADDING_FIELD = b"FB"  # the zip extra-field id torch pads its local headers with


def storage_name(dtype: np.dtype) -> str:
    """torch's storage class for a numpy dtype ("FloatStorage" for float32); ValueError if it has none."""
    name = _STORAGE_NAMES.get(np.dtype(dtype).newbyteorder("<"))
    if name is None:
        raise ValueError(f"no torch storage type for numpy dtype {np.dtype(dtype)}")
    return name


# --- the pickle, opcode by opcode (pickletools' names) -----------------------------------------------------
def _global(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode("ascii")  # GLOBAL


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _int(value: int) -> bytes:
    if 0 <= value < 1 << 8:
        return b"K" + struct.pack("<B", value)  # BININT1
    if 0 <= value < 1 << 16:
        return b"M" + struct.pack("<H", value)  # BININT2
    if -(1 << 31) <= value < 1 << 31:
        return b"J" + struct.pack("<i", value)  # BININT
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + struct.pack("<B", len(raw)) + raw  # LONG1


def _tuple(items: list[bytes]) -> bytes:
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


_EMPTY_ORDERED_DICT = _global("collections", "OrderedDict") + b")R"  # OrderedDict() : EMPTY_TUPLE, REDUCE


def _tensor(key: str, array: np.ndarray) -> bytes:
    """_rebuild_tensor_v2(storage data/<key>, 0, shape, C-contiguous strides, False, OrderedDict())."""
    shape = [int(n) for n in array.shape]
    # From the shape, as torch does for a contiguous tensor (numpy's may be anything on a size-1 axis).
    strides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]
    storage_type = _global("torch", storage_name(array.dtype))
    storage = _tuple([_text("storage"), storage_type, _text(key), _text("cpu"), _int(array.size)])
    arguments = _tuple(
        [
            storage + b"Q",  # BINPERSID: torch.load resolves the id to the storage
            _int(0),
            _tuple([_int(n) for n in shape]),
            _tuple([_int(s) for s in strides]),
            b"\x89",  # NEWFALSE: requires_grad
            _EMPTY_ORDERED_DICT,  # backward hooks
        ]
    )
    return _global("torch._utils", "_rebuild_tensor_v2") + arguments + b"R"


def state_dict_pickle(arrays: Mapping[str, np.ndarray]) -> bytes:
    """data.pkl for `arrays` (C-contiguous, little-endian): an OrderedDict, storage i for the i-th array."""
    items = [_text(name) + _tensor(str(i), array) for i, (name, array) in enumerate(arrays.items())]
    return b"\x80\x02" + _EMPTY_ORDERED_DICT + b"(" + b"".join(items) + b"u."  # PROTO 2 ... SETITEMS, STOP


# --- the zip ----------------------------------------------------------------------------------------------
def _padding_extra(offset: int, name: str, size: int) -> bytes:
    """A local-header extra field that puts the data of a member written at `offset` on an ALIGN boundary."""
    header = 30 + len(name.encode("utf-8")) + 4  # fixed local header, the name, the field's own id and size
    if size * 1.05 > zipfile.ZIP64_LIMIT:  # zipfile then appends its 20-byte zip64 field to ours
        header += 20
    padding = -(offset + header) % ALIGN
    return _PADDING_FIELD + struct.pack("<H", padding) + b"Z" * padding


def _little_endian(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array, order="C")  # (ascontiguousarray would make a 0-d array 1-d)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def write_state_dict(out: BinaryIO, arrays: Mapping[str, np.ndarray], archive_name: str = "archive") -> None:
    """Write `arrays` (name -> numpy array) to the seekable binary file `out` as torch.save(state_dict, out)
    would, with `archive_name` as the zip's top folder (torch uses the file's name without its suffix)."""
    arrays = {name: _little_endian(array) for name, array in arrays.items()}
    for array in arrays.values():
        storage_name(array.dtype)  # refuse a dtype torch has no storage for before writing anything
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:

        def member(name: str, data: bytes | memoryview, aligned: bool = False) -> None:
            info = zipfile.ZipInfo(f"{archive_name}/{name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            if aligned:
                info.extra = _padding_extra(out.tell(), info.filename, len(data))
            archive.writestr(info, data)

        member("data.pkl", state_dict_pickle(arrays))
        for name, data in _RECORDS_BEFORE_DATA.items():
            member(name, data)
        for i, array in enumerate(arrays.values()):
            member(f"data/{i}", array.reshape(-1).view(np.uint8).data, aligned=True)
        for name, data in _RECORDS_AFTER_DATA.items():
            member(name, data)
