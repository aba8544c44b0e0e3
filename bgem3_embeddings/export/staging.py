"""Write an export into a temporary folder next to OUT and rename it into place only when complete."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bgem3_embeddings.export.options import ExportError, check_output_dir

logger = logging.getLogger(__name__)


@contextmanager
def staged_output(out: Path) -> Iterator[Path]:
    """Yield an empty staging folder; on success it becomes `out`, on any error it is deleted.

    The staging folder is a sibling of `out` (same file system), so the final rename is atomic and a
    failed or interrupted export never leaves a half-written OUT behind.
    """
    out = check_output_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # mkdir (not mkdtemp, which makes a 0700 folder) so the export gets the usual umask permissions.
    staging = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    try:
        yield staging
        check_output_dir(out)  # something may have appeared there while we were exporting
        if out.is_dir():
            out.rmdir()  # empty (checked above): os.rename cannot replace a folder on every platform
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("export written to %s", out)


__all__ = ["ExportError", "staged_output"]
