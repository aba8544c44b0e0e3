"""`bgem3-qdrant migrate`: a local-mode store (earlier releases) moved to Qdrant Edge in place."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..schema import COLBERT_DTYPES, check_choice
from .common import (
    VerboseOpt,
    fail,
    setup_logging,
)


def migrate(
    path: Annotated[Path, typer.Argument(help="Folder of a store written by qdrant-client's local mode.")],
    colbert_dtype: Annotated[
        str,
        typer.Option(help="ColBERT storage in the new store: float32 (exact copy, default), float16, uint8."),
    ] = "float32",
    verbose: VerboseOpt = False,
) -> None:
    """Move a local-mode store (earlier releases) to Qdrant Edge in place; old files kept as a backup."""
    setup_logging(verbose)
    from tqdm.auto import tqdm

    from ..tools.migrate import migrate_local_store

    try:
        check_choice("--colbert-dtype", colbert_dtype, COLBERT_DTYPES)
    except ValueError as e:
        raise fail(e) from e
    bars: dict[str, Any] = {}

    def progress(name: str, done: int, total: int) -> None:
        bar = bars.get(name) or bars.setdefault(name, tqdm(total=total, desc=name, unit="point"))
        bar.update(done - bar.n)

    try:
        report = migrate_local_store(path, colbert_dtype=colbert_dtype, progress=progress)  # type: ignore[arg-type]
    finally:
        for bar in bars.values():
            bar.close()
    typer.echo(report.format())
