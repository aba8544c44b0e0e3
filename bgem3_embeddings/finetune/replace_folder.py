"""Replace a folder as one step: write the new one beside it, flush it to disk, then rename it into place.

    with replaced_atomically(output_dir) as folder:
        ...write every file into `folder`...

The files are written into `.NAME.partial-PID` next to NAME (the same file system, so renames are atomic).
When the block ends they are fsynced, an existing NAME is renamed to `.NAME.previous-PID`, the new folder
is renamed to NAME and the previous one removed: until the new folder is complete on disk, NAME is the last
complete one. A failure while writing (a full disk: ENOSPC) removes the partial folder and raises
`FolderWriteError`, one line that says what failed and that NAME is untouched.

A process killed part-way leaves a `.NAME.partial-PID` (deleted by the next write, or by
`recover_interrupted`), or, killed between the two renames, NAME's previous content in `.NAME.previous-PID`
with no NAME: `recover_interrupted` renames it back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

PARTIAL = "partial"
PREVIOUS = "previous"


class FolderWriteError(OSError):
    """Writing a folder failed (a full disk, no permission); the folder it was to replace is untouched."""


def _sibling(output_dir: Path, kind: str, pid: int) -> Path:
    return output_dir.parent / f".{output_dir.name}.{kind}-{pid}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _left_behind(output_dir: Path, kind: str) -> list[Path]:
    """`.NAME.<kind>-PID` folders of processes no longer running (or of this one: its own earlier try)."""
    found = []
    for path in output_dir.parent.glob(f".{output_dir.name}.{kind}-*"):
        pid = path.name.rsplit("-", 1)[1]
        if pid.isdigit() and (int(pid) == os.getpid() or not _running(int(pid))):
            found.append(path)
    return found


def recover_interrupted(output_dir: Path) -> None:
    """Tidy what an interrupted write left beside `output_dir`: partial folders are removed, and a previous
    folder is renamed back to `output_dir` when a kill between the two renames left none there."""
    output_dir = Path(output_dir)
    for previous in _left_behind(output_dir, PREVIOUS):
        if not output_dir.exists():
            logger.warning("%s was being replaced when its writer stopped: restored it from %s", output_dir,
                           previous.name)
            os.rename(previous, output_dir)
        else:
            shutil.rmtree(previous)
    for partial in _left_behind(output_dir, PARTIAL):
        logger.info("removing %s, left by an interrupted write", partial)
        shutil.rmtree(partial)


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's (its entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder`, and `folder` itself."""
    for root, _dirs, names in os.walk(folder):
        for name in names:
            _fsync(Path(root, name))
        _fsync(Path(root))


def _what_failed(err: OSError) -> str:
    cause = err.strerror or str(err)
    return f"writing {Path(err.filename).name} failed ({cause})" if err.filename else cause


@contextlib.contextmanager
def replaced_atomically(output_dir: Path) -> Iterator[Path]:
    """Yield an empty folder beside `output_dir`; when the block ends, it replaces `output_dir` whole (what
    was there is gone). An OSError in the block or while swapping becomes a FolderWriteError, and any
    error leaves `output_dir` as it was, without the partial folder."""
    output_dir = Path(output_dir).absolute()
    if not output_dir.name or output_dir.name in (".", ".."):
        raise FolderWriteError(f"cannot replace {output_dir}: name a folder to write")
    if output_dir.exists() and not output_dir.is_dir():
        raise FolderWriteError(f"cannot replace {output_dir}: it is a file, not a folder")
    existed = output_dir.exists()
    kept = (
        f"the last complete checkpoint in {output_dir} is untouched"
        if existed
        else f"no partial folder was left in {output_dir.parent}"
    )
    partial = _sibling(output_dir, PARTIAL, os.getpid())
    try:
        output_dir.parent.mkdir(parents=True, exist_ok=True)
        recover_interrupted(output_dir)
        partial.mkdir()
    except OSError as err:
        raise FolderWriteError(f"cannot write beside {output_dir}: {_what_failed(err)}") from err
    try:
        yield partial
        fsync_tree(partial)
        _swap(partial, output_dir)
    except OSError as err:
        shutil.rmtree(partial, ignore_errors=True)
        raise FolderWriteError(f"could not save to {output_dir}: {_what_failed(err)}; {kept}") from err
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _swap(partial: Path, output_dir: Path) -> None:
    """Rename `partial` to `output_dir`, moving an existing `output_dir` aside first and removing it after."""
    if not output_dir.exists():
        os.rename(partial, output_dir)
        _fsync(output_dir.parent)
        return
    previous = _sibling(output_dir, PREVIOUS, os.getpid())
    os.rename(output_dir, previous)
    try:
        os.rename(partial, output_dir)
    except OSError:
        os.rename(previous, output_dir)
        raise
    _fsync(output_dir.parent)
    shutil.rmtree(previous, ignore_errors=True)
