"""A converted-weights cache: the model's variables in Keras layout, memory-mapped straight into TensorFlow.

Porting a Hugging Face checkpoint reads 2.27 GB, transposes every Linear weight and copies it into freshly
allocated variables (5-7 s on a 2-core EPYC with a warm page cache). The first load therefore also writes
the ported variables to one safetensors file (no pickle), named by the checkpoint's folder and precision:

    <cache dir>/<sha256(folder, precision)[:20]>-<precision>.safetensors

Later loads map that file copy-on-write (MAP_PRIVATE) and hand each tensor to TensorFlow through DLPack,
so the variables share the page cache's pages: nothing is read or copied up front, and several processes
on one machine share one copy of the weights. A write to such a variable copies its pages privately;
the file never changes.

Invalidation: the header's metadata holds a fingerprint (size and mtime of config.json, the weight files
and both heads) and the cache format version; any difference, a missing or misshapen tensor, or a
malformed file makes the loader port from the checkpoint again and rewrite the file. Files are replaced
atomically (write to a temporary name, then rename), so a process still mapping the old file keeps
valid pages.

Cache location: `weights_cache` of BGEM3Encoder, else $BGEM3_WEIGHTS_CACHE, else
$XDG_CACHE_HOME/bgem3_embeddings/converted (~/.cache/...). BGEM3_WEIGHTS_CACHE=off disables it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.checkpoint.files import CheckpointFiles
from bgem3_embeddings.checkpoint.safetensors_reader import SafetensorsFile
from bgem3_embeddings.checkpoint.tensor_source import CheckpointFormatError

logger = logging.getLogger(__name__)

FORMAT_VERSION = "1"
ENV_VAR = "BGEM3_WEIGHTS_CACHE"
OFF_VALUES = ("0", "off", "false", "no", "none")
# TensorFlow and DLPack want 64-byte aligned buffers; a tensor at another address is copied instead.
ALIGN = 64
_SAFETENSORS_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


# Not prefetched (_prefetch): a query reads a few rows of the word table (1 GB at full size in float32).
WORD_TABLE = "embeddings/word_embeddings/embeddings"


def default_cache_dir() -> Path | None:
    """$BGEM3_WEIGHTS_CACHE (None when it says off), else $XDG_CACHE_HOME/bgem3_embeddings/converted."""
    env = os.environ.get(ENV_VAR)
    if env is not None:
        return None if env.strip().lower() in OFF_VALUES else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bgem3_embeddings" / "converted"


def resolve_cache_dir(weights_cache: bool | str | Path | None) -> Path | None:
    """The folder to use: True = the default (or the environment's), False/None = no cache, or a path."""
    if weights_cache is True:
        return default_cache_dir()
    if weights_cache is False or weights_cache is None:
        return None
    return Path(weights_cache).expanduser()


def _source_paths(files: CheckpointFiles) -> list[Path]:
    """Every file the converted weights are derived from (shards of a sharded checkpoint included)."""
    paths = [files.config, files.weights]
    if files.weights.name.endswith(".index.json"):
        try:
            weight_map = json.loads(files.weights.read_text()).get("weight_map", {})
            paths += sorted({files.weights.parent / name for name in weight_map.values()})
        except (OSError, ValueError, AttributeError):
            pass  # porting reports a broken index precisely; the fingerprint just includes the index file
    paths += [p for p in (files.sparse_head, files.colbert_head) if p is not None]
    return paths


def fingerprint(files: CheckpointFiles, precision: str) -> str:
    """Size and modification time of every source file, the precision and the cache format version."""
    parts = [f"format={FORMAT_VERSION}", f"precision={precision}"]
    for path in _source_paths(files):
        stat = path.stat()  # follows the Hugging Face cache's symlinks to the blobs
        parts.append(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return ";".join(parts)


def cache_file(cache_dir: Path, files: CheckpointFiles, precision: str) -> Path:
    """The cache file of this checkpoint folder in this precision."""
    key = hashlib.sha256(f"{Path(files.root).resolve()}\n{precision}".encode()).hexdigest()[:20]
    return cache_dir / f"{key}-{precision}.safetensors"


def open_converted(
    path: Path, expected_fingerprint: str, expected: Mapping[str, tuple[tuple[int, ...], str]]
) -> dict[str, Any] | None:
    """name -> tensor sharing the mapped file (_tensor_view), or None (logged) when it is stale or wrong.

    `expected` maps each variable path to its (shape, dtype name); every one must be present with exactly
    that shape and dtype, and nothing else may be.
    """
    if not path.is_file():
        return None
    try:
        with SafetensorsFile(path) as file:
            if file.metadata().get("fingerprint") != expected_fingerprint:
                logger.info("converted weights %s are stale (checkpoint changed): converting again", path)
                return None
            infos = file.infos()
            if set(infos) != set(expected):
                logger.warning("converted weights %s do not match the model's variables: ignored", path)
                return None
            layouts = {}
            for name, (shape, dtype) in expected.items():
                stored_shape, stored, offset = file.layout(name)
                stored_kind = "bfloat16" if stored == np.dtype("<u2") else stored.name
                if tuple(stored_shape) != tuple(shape) or stored_kind != dtype:
                    logger.warning(
                        "converted weights %s: %s is %s %s, the model expects %s %s: ignored",
                        path, name, stored_kind, stored_shape, dtype, tuple(shape),
                    )
                    return None
                layouts[name] = (tuple(shape), stored, offset, dtype)
    except (OSError, CheckpointFormatError) as err:
        logger.warning("converted weights %s unreadable (%s): converting again", path, err)
        return None
    mapped = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: the file is never written
    _prefetch(path, [
        (offset, _nbytes(shape, stored))
        for name, (shape, stored, offset, _) in layouts.items()
        if name != WORD_TABLE
    ])
    return {
        name: _tensor_view(mapped, offset, stored, shape, dtype)
        for name, (shape, stored, offset, dtype) in layouts.items()
    }


def _nbytes(shape: tuple[int, ...], stored: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * stored.itemsize


def _prefetch(path: Path, spans: list[tuple[int, int]]) -> None:
    """Ask the kernel to start reading these (offset, size) spans of `path` into the page cache.

    Mapped weights are read when first touched. With a cold page cache the first query then faults in
    every layer (about 1.2 GB at full size) a few pages at a time; POSIX_FADV_WILLNEED starts those reads
    now, in large requests: measured cold, construction 0.21 -> 0.57 s and the first vector 1.84-2.75 ->
    0.76-0.91 s (docs/performance/memory-and-startup.md#start-up). Linux only (a no-op elsewhere);
    advice, never an error.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        for offset, size in spans:
            if size > 0:
                os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)
    except OSError as err:  # advice only: a file system may refuse it
        logger.debug("prefetch of %s refused: %s", path, err)
    finally:
        os.close(fd)


def _tensor_view(
    mapped: np.ndarray, offset: int, stored: np.dtype, shape: tuple[int, ...], dtype: str
) -> Any:
    """A tensor over mapped[offset:...]. On TensorFlow a tf.Tensor, shared through DLPack when aligned and
    copied otherwise; on JAX and PyTorch a numpy view that Keras turns into the variable (PyTorch shares
    it, JAX copies it to its device)."""
    from bgem3_embeddings.backends.keras_backend import backend_name

    size = _nbytes(shape, stored)
    array = mapped[offset : offset + size].view(stored).reshape(shape)
    if backend_name() != "tensorflow":
        import ml_dtypes  # a Keras dependency: numpy's bfloat16

        return array.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else array
    import tensorflow as tf

    if array.ctypes.data % ALIGN == 0 and array.size > 0:
        tensor = tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    else:
        tensor = tf.constant(np.array(array))
    return tf.bitcast(tensor, tf.bfloat16) if dtype == "bfloat16" else tensor


def write_converted(path: Path, tensors: Mapping[str, Any], expected_fingerprint: str) -> None:
    """Write `tensors` (name -> tf.Variable or array) as an aligned safetensors file, atomically.

    Largest tensors first, data start padded to 64 bytes: every tensor whose predecessors' sizes are
    multiples of 64 bytes (all but the tiny sparse-head bias at the very end) starts 64-byte aligned.
    The safetensors layout stays standard (no holes): any safetensors reader opens it.
    """
    arrays = {name: _as_numpy(value) for name, value in tensors.items()}
    order = sorted(arrays, key=lambda n: (-arrays[n].nbytes % ALIGN != 0, -arrays[n].nbytes, n))
    header: dict[str, Any] = {"__metadata__": {"fingerprint": expected_fingerprint, "format": FORMAT_VERSION}}
    offset = 0
    for name in order:
        array = arrays[name]
        kind = "BF16" if array.dtype == np.dtype("<u2") else _SAFETENSORS_DTYPE[array.dtype.name]
        span = [offset, offset + array.nbytes]
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": span}
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGN)  # the format allows trailing spaces in the header
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(len(raw).to_bytes(8, "little"))
            out.write(raw)
            for name in order:
                out.write(np.ascontiguousarray(arrays[name]).data.cast("B"))
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache may be shared by other users' processes
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _as_numpy(value: Any) -> np.ndarray:
    """A variable's value as little-endian numpy; bfloat16 as its uint16 bit pattern."""
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.dtype.name == "bfloat16":
        return array.view(np.uint16)
    return array
