"""What a store folder holds (an Edge store, an old local-mode store, or nothing yet) and its lock."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Literal

from ..errors import BGEM3QdrantError, LegacyStoreError, StoreUnavailableError, store_busy_message

MARKER = "bgem3-store.json"
FORMAT = 1
Kind = Literal["edge", "local", "empty", "other"]


def detect(path: str | os.PathLike[str]) -> Kind:
    """edge (our marker), local (qdrant-client local mode: meta.json + collection/), empty, or other."""
    p = Path(path)
    if not p.exists():
        return "empty"
    if not p.is_dir():
        return "other"
    if (p / MARKER).is_file():
        return "edge"
    if (p / "meta.json").is_file() and (p / "collection").is_dir():
        return "local"
    visible = [c for c in p.iterdir() if c.name not in (".lock",)]
    return "empty" if not visible else "other"


def allocated_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes allocated on disk under `path` (like `du`): Edge preallocates sparse files, whose apparent
    size overstates what they take."""
    total = 0
    for f in Path(path).rglob("*"):
        if f.is_file():
            st = f.stat()
            total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return total


def write_marker(path: Path) -> None:
    """Mark `path` as an Edge store (idempotent)."""
    m = path / MARKER
    if not m.exists():
        tmp = path / (MARKER + ".tmp")
        tmp.write_text(json.dumps({"engine": "edge", "format": FORMAT}) + "\n", encoding="utf-8")
        tmp.replace(m)


def check_openable(path: Path) -> None:
    """Raise a clear error unless `path` is an Edge store or may become one."""
    kind = detect(path)
    if kind == "local":
        raise LegacyStoreError(path)
    if kind == "other":
        raise BGEM3QdrantError(
            f"{path} is not a bgem3-qdrant store (no {MARKER}) and is not empty; "
            "pass --path with a new or empty folder, or the folder of an existing store."
        )


def lock_store(path: Path, *, create: bool = True) -> IO[str] | None:
    """Hold an exclusive lock on the store folder for this process (released on close or process death).

    Edge's own lock surfaces as a bare "Can't init WAL: WouldBlock" on the first collection opened;
    this lock fails at open with a message saying what to do.
    """
    check_openable(path)
    if not path.exists():
        if not create:
            raise BGEM3QdrantError(f"no store at {path}")
        try:
            path.mkdir(parents=True)
        except OSError as e:  # a file where a folder should be, no permission, ...
            raise BGEM3QdrantError(
                f"cannot create the store folder {path} (--path): {e.strerror or e}; pass --path with a "
                "folder that can be created"
            ) from e
    try:
        import fcntl
    except ImportError:  # Windows: Edge's own WAL lock still refuses a second opener
        return None
    try:
        f = open(path / ".lock", "a+", encoding="utf-8")  # noqa: SIM115 - held open while the store is
    except PermissionError as e:
        raise StoreUnavailableError(
            f"the store at {path} is read-only for this user (cannot write {path / '.lock'}) (--path): the "
            "embedded engine writes to its folder even to search; copy the store to a writable folder, or "
            "fix its permissions"
        ) from e
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        f.close()
        raise StoreUnavailableError(store_busy_message(path)) from e
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
