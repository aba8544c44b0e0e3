"""A checkpoint's fingerprint: which weights, tokenizer and config these are, cheap to compute per load.

Stores record it to tell vectors of one model from another's, whatever folder or hub id the model came
from. Reading 2.3 GB of weights per command would cost seconds, so the weight files contribute their size
and 16 evenly spaced 64 KiB windows (first and last included): two trainings, or two random seeds, differ in
every window, while a copy of the same files (another folder, the hub cache) gives the same fingerprint.
Config, tokenizer files and both heads are small and are hashed whole.

    >>> checkpoint_fingerprint(resolve_checkpoint("BAAI/bge-m3"))   # doctest: +SKIP
    'a3f2…' (64 hex digits)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bgem3_embeddings.checkpoint.files import TOKENIZER_FILES, CheckpointFiles

WINDOWS = 16
WINDOW_BYTES = 64 * 1024
FORMAT = "bgem3-fingerprint-1"  # changes if what is hashed changes


def _hash_whole(h: hashlib._Hash, path: Path) -> None:
    h.update(path.read_bytes())


def _hash_sampled(h: hashlib._Hash, path: Path) -> None:
    """Size, then WINDOWS windows of WINDOW_BYTES spread over the file (all of it when small)."""
    size = path.stat().st_size
    h.update(size.to_bytes(8, "little"))
    with path.open("rb") as f:
        if size <= WINDOWS * WINDOW_BYTES:
            h.update(f.read())
            return
        step = (size - WINDOW_BYTES) / (WINDOWS - 1)
        for i in range(WINDOWS):
            f.seek(int(i * step))
            h.update(f.read(WINDOW_BYTES))


def _weight_files(weights: Path) -> list[Path]:
    """The weights file, or a sharded index and its shards in index order."""
    if not weights.name.endswith(".index.json"):
        return [weights]
    index = json.loads(weights.read_text(encoding="utf-8"))
    shards = sorted(set(index.get("weight_map", {}).values()))
    return [weights, *(weights.parent / s for s in shards)]


def checkpoint_fingerprint(files: CheckpointFiles) -> str:
    """Hex SHA-256 over config, tokenizer files, sampled encoder weights and both heads (see module doc)."""
    h = hashlib.sha256(FORMAT.encode())
    parts: list[tuple[str, Path, bool]] = [("config", files.config, False)]
    parts += [(name, files.root / name, False) for name in sorted(TOKENIZER_FILES)]
    parts += [(f"weights:{p.name}", p, True) for p in _weight_files(files.weights)]
    parts += [
        (name, path, False)
        for name, path in (("colbert", files.colbert_head), ("sparse", files.sparse_head))
        if path is not None
    ]
    for name, path, sampled in parts:
        if not path.is_file():
            continue
        h.update(f"\0{name}\0".encode())
        (_hash_sampled if sampled else _hash_whole)(h, path)
    return h.hexdigest()
