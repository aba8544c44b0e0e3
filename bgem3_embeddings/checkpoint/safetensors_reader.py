"""A small reader of the safetensors format, reading tensors on demand with seek + readinto.

Layout: 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape, data_offsets}},
plus an optional "__metadata__" entry of strings, ignored here), then the raw little-endian tensor
bytes; data_offsets are [begin, end) relative to the first byte after the header.
Sharded checkpoints (model.safetensors.index.json) are opened by `tensor_source.open_tensor_source`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.checkpoint.tensor_source import (
    CheckpointFormatError,
    FileTensorSource,
    TensorInfo,
    bfloat16_to_float32,
    row_range,
)

logger = logging.getLogger(__name__)

# safetensors dtype -> stored numpy dtype (little-endian). BF16 is read as uint16 and widened.
_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
# A real header is a few tens of KB; a huge one means a corrupt or hostile file.
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsFile(FileTensorSource):
    """One .safetensors file. Only the header is read on open; tensors are read by `read`."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        try:
            self._entries, self._metadata = self._parse_header()
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{self.path}: not a valid safetensors file: {what}")

    def _parse_header(self) -> tuple[dict[str, tuple[TensorInfo, np.dtype, int]], dict[str, str]]:
        """Parse and validate the header: (name -> (info, stored dtype, absolute data offset), metadata)."""
        if self.file_size < 8:
            raise self._fail(f"only {self.file_size} bytes, too short for the 8-byte header length")
        size_buf = np.empty(1, dtype="<u8")
        self._read_into(0, size_buf, "header length")
        header_len = int(size_buf[0])
        if header_len > min(_MAX_HEADER_BYTES, self.file_size - 8):
            raise self._fail(f"header length {header_len} exceeds the file size {self.file_size}")
        raw = np.empty(header_len, dtype=np.uint8)
        self._read_into(8, raw, "header")
        try:
            header: Any = json.loads(raw.tobytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._fail(f"header is not valid JSON ({e})") from e
        if not isinstance(header, dict):
            raise self._fail("header is not a JSON object")

        data_start = 8 + header_len
        data_size = self.file_size - data_start
        entries: dict[str, tuple[TensorInfo, np.dtype, int]] = {}
        metadata = header.get("__metadata__") or {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._fail("__metadata__ is not an object of strings")
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            entries[name] = self._parse_entry(name, entry, data_start, data_size)
        return entries, metadata

    def _parse_entry(
        self, name: str, entry: Any, data_start: int, data_size: int
    ) -> tuple[TensorInfo, np.dtype, int]:
        if not isinstance(entry, dict):
            raise self._fail(f"entry for tensor {name!r} is not an object")
        dtype_name, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype_name not in _DTYPES:
            raise self._fail(f"tensor {name!r} has unsupported dtype {dtype_name!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise self._fail(f"tensor {name!r} has an invalid shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise self._fail(f"tensor {name!r} has invalid data_offsets {offsets!r}")
        stored = _DTYPES[dtype_name]
        begin, end = offsets
        expected = int(np.prod(shape, dtype=np.int64)) * stored.itemsize
        if end - begin != expected:
            raise self._fail(
                f"tensor {name!r}: data_offsets {offsets} span {end - begin} bytes, "
                f"but dtype {dtype_name} and shape {shape} need {expected}"
            )
        if end > data_size:
            raise self._fail(
                f"tensor {name!r}: data ends at byte {data_start + end}, past the end of the file "
                f"({self.file_size} bytes; truncated download?)"
            )
        out_dtype = np.dtype(np.float32) if dtype_name == "BF16" else stored.newbyteorder("=")
        return TensorInfo(name, tuple(shape), out_dtype), stored, data_start + begin

    def infos(self) -> dict[str, TensorInfo]:
        return {name: info for name, (info, _, _) in self._entries.items()}

    def metadata(self) -> dict[str, str]:
        """The header's "__metadata__" strings (empty when absent)."""
        return dict(self._metadata)

    def layout(self, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
        """(shape, stored dtype, absolute byte offset) of one tensor, validated against the file size."""
        info, stored, offset = self._entries[name]
        return info.shape, stored, offset

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        if name not in self._entries:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        info, stored, offset = self._entries[name]
        start, stop = row_range(name, info.shape, rows)
        row_items = int(np.prod(info.shape[1:], dtype=np.int64))
        shape = (stop - start, *info.shape[1:]) if info.shape else ()
        out = np.empty(shape, dtype=stored)
        self._read_into(offset + start * row_items * stored.itemsize, out, f"tensor {name!r}")
        if stored.name == "uint16" and info.dtype == np.float32:
            return bfloat16_to_float32(out)
        # Stored little-endian; on a big-endian host swap to native order.
        return out if stored.isnative else out.astype(stored.newbyteorder("="))
