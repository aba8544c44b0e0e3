"""One reading interface over every checkpoint format: names, shapes, and tensors read on demand.

A `TensorSource` never maps or loads a whole file: `read` seeks to one tensor (or a row range of it) and
reads exactly those bytes into a fresh numpy array, so loading a 2.27 GB checkpoint holds at most the
arrays the caller keeps plus one tensor in flight. No reader needs torch.

Dtypes: arrays come back in the stored dtype (float32, float16, float64, integer, bool), except bfloat16,
which numpy lacks: it is widened to float32 exactly (bfloat16 is the top half of a float32).
`TensorInfo.dtype` is always the dtype `read` returns.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)

SAFETENSORS_INDEX_SUFFIX = ".safetensors.index.json"
TORCH_SUFFIXES = (".bin", ".pt", ".pth")


class CheckpointFormatError(ValueError):
    """A checkpoint file is missing, malformed, truncated or of an unsupported kind; names the file."""


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and the numpy dtype that `TensorSource.read` returns for one tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


@runtime_checkable
class TensorSource(Protocol):
    """Named tensors of one checkpoint, read lazily. Use as a context manager or call `close`."""

    def infos(self) -> dict[str, TensorInfo]:
        """Every tensor's name, shape and dtype, without reading any tensor data."""
        ...

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        """Read one tensor, or rows `rows` of its axis 0 (step 1), reading only those bytes."""
        ...

    def close(self) -> None:
        """Release open file handles. Idempotent."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def bfloat16_to_float32(raw: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bits (stored as uint16) to float32: exact, bf16 is the high half of an f32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def row_range(name: str, shape: tuple[int, ...], rows: slice | None) -> tuple[int, int]:
    """Validate `rows` for a tensor of `shape` and return the [start, stop) row range to read."""
    if rows is None:
        return 0, (shape[0] if shape else 1)
    if not shape:
        raise ValueError(f"tensor {name!r} is a scalar: it has no rows to slice")
    start, stop, step = rows.indices(shape[0])
    if step != 1:
        raise ValueError(f"row slices must have step 1, got {rows} for tensor {name!r}")
    return start, max(start, stop)


def read_exact(file: io.RawIOBase, offset: int, out: np.ndarray, where: str) -> None:
    """Fill `out` with bytes from `file` at `offset` (seek + readinto, looping over short reads)."""
    view = out.reshape(-1).view(np.uint8).data  # `out` is a fresh C-contiguous array: no copy
    if not len(view):
        return
    file.seek(offset)
    done = 0
    while done < len(view):
        n = file.readinto(view[done:])
        if not n:
            raise CheckpointFormatError(
                f"{where}: file ends early: expected {len(view)} bytes at offset {offset}, got {done}"
            )
        done += n


class ClosesOnExit:
    """`with source:` closes it on exit; subclasses define close()."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class FileTensorSource(ClosesOnExit):
    """Base for sources backed by one open file: lock-guarded seek+read, context manager, close."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            # Unbuffered: big reads go straight into the numpy buffer, with no intermediate copy.
            self._file: io.FileIO | None = open(self.path, "rb", buffering=0)  # noqa: SIM115
        except OSError as e:
            raise CheckpointFormatError(f"{self.path}: cannot open checkpoint file: {e}") from e
        self.file_size = os.fstat(self._file.fileno()).st_size
        self._lock = threading.Lock()  # seek+read pairs must not interleave across threads

    def _read_into(self, offset: int, out: np.ndarray, what: str) -> None:
        with self._lock:
            if self._file is None:
                raise ValueError(f"{self.path}: tensor source is closed")
            read_exact(self._file, offset, out, f"{self.path} ({what})")

    def close(self) -> None:
        file = getattr(self, "_file", None)  # absent when __init__ failed to open the file
        if file is not None:
            file.close()
            self._file = None

    def __del__(self) -> None:
        self.close()


class ShardedTensorSource(ClosesOnExit):
    """Several shard files behind one index (`weight_map`: tensor name -> shard file name)."""

    def __init__(
        self, index_path: Path, weight_map: Mapping[str, str], opener: Callable[[Path], TensorSource]
    ) -> None:
        self.path = Path(index_path)
        self._shards: dict[str, TensorSource] = {}
        self._where: dict[str, TensorSource] = {}
        self._infos: dict[str, TensorInfo] = {}
        directory = self.path.parent.resolve()
        shard_infos: dict[str, dict[str, TensorInfo]] = {}
        try:
            for name, shard_name in weight_map.items():
                if shard_name not in self._shards:
                    shard_path = (directory / shard_name).resolve()
                    # The index is data from the download: it must not point outside its folder.
                    if not shard_path.is_relative_to(directory):
                        raise CheckpointFormatError(
                            f"{self.path}: shard {shard_name!r} lies outside the checkpoint folder"
                        )
                    self._shards[shard_name] = opener(shard_path)
                    shard_infos[shard_name] = self._shards[shard_name].infos()
                if name not in shard_infos[shard_name]:
                    raise CheckpointFormatError(
                        f"{self.path}: tensor {name!r} is mapped to shard {shard_name!r}, which lacks it"
                    )
                self._where[name] = self._shards[shard_name]
                self._infos[name] = shard_infos[shard_name][name]
        except BaseException:
            self.close()
            raise

    def infos(self) -> dict[str, TensorInfo]:
        return dict(self._infos)

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        if name not in self._where:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return self._where[name].read(name, rows)

    def close(self) -> None:
        for shard in self._shards.values():
            shard.close()
