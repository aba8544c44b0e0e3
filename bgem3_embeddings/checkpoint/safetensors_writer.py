"""Write a safetensors file one tensor at a time, each produced only when its bytes are written.

The header (names, dtypes, shapes, offsets) needs only the shapes, so a model's weights are converted and
written one by one: saving holds one converted tensor beside the model, not a second copy of all of them
(as `safetensors.numpy.save_file` would, from a dict of arrays). Layout: see safetensors_reader.py; the
header is padded with spaces to 8 bytes as the safetensors library pads it, and tensors are ordered by
dtype size (largest first) then name, so every tensor starts aligned to its element size.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

_SAFETENSORS_DTYPES = {
    np.dtype("<f8"): "F64",
    np.dtype("<f4"): "F32",
    np.dtype("<f2"): "F16",
    np.dtype("<i8"): "I64",
    np.dtype("<i4"): "I32",
    np.dtype("<i2"): "I16",
    np.dtype("i1"): "I8",
    np.dtype("u1"): "U8",
    np.dtype("?"): "BOOL",
}


@dataclass(frozen=True)
class PendingTensor:
    """A tensor to write: its name, shape and dtype now, its values from `produce()` when written."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def write_safetensors(
    out: BinaryIO, tensors: Sequence[PendingTensor], metadata: dict[str, str] | None = None
) -> None:
    """Write `tensors` to the binary file `out`; a produced array of another shape is a ValueError."""
    order = sorted(tensors, key=lambda t: (-t.dtype.itemsize, t.name))
    if len({t.name for t in order}) != len(order):
        raise ValueError("tensor names must be unique")
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for tensor in order:
        kind = _SAFETENSORS_DTYPES.get(tensor.dtype.newbyteorder("<"))
        if kind is None:
            raise ValueError(f"{tensor.name}: no safetensors dtype for numpy dtype {tensor.dtype}")
        span = [offset, offset + tensor.nbytes]
        header[tensor.name] = {"dtype": kind, "shape": list(tensor.shape), "data_offsets": span}
        offset += tensor.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    out.write(len(raw).to_bytes(8, "little"))
    out.write(raw)
    for tensor in order:
        array = np.asarray(tensor.produce(), dtype=tensor.dtype.newbyteorder("<"), order="C")
        if array.shape != tensor.shape:
            raise ValueError(f"{tensor.name}: produced shape {array.shape}, declared {tensor.shape}")
        out.write(array.reshape(-1).view(np.uint8).data)
