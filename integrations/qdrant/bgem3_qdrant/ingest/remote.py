"""What the driver of a distributed engine (Ray, Spark) knows of the model without loading it.

The driver plans exactly as the plain engine does (same tokenizer, `BGEM3Tokenizer`, so the same chunks
and point ids) and imports neither TensorFlow nor torch: it reads the checkpoint's tokenizer and config
only; the encoders load in the engine's workers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..identity import ModelIdentity
from .encoding import EncodeResult, Encoding
from .options import IngestOptions
from .plan import ChunkRecord
from .rows import to_row


def checkpoint_tokenizer(model: str) -> tuple[Any, Any]:
    """The checkpoint's files and the encoder's own tokenizer class built from them (BGEM3Encoder builds the
    same from the same files), without TensorFlow."""
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    files = resolve_checkpoint(model)
    return BGEM3Tokenizer.from_dir(files.root), files


class RemoteEncoding(Encoding):
    """Base of the engines whose encoders run elsewhere: `model` (hub id or folder) resolved here for its
    tokenizer, hidden size and fingerprint; `encoder_kwargs` go to each worker's BGEM3Encoder.

    `submit` only collects the chunks as rows (rows.py): the engine starts its workers in `finish`, once
    the whole plan is known, and takes them with `take_rows`."""

    def __init__(self, model: str, encoder_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer, files = checkpoint_tokenizer(model)
        self.files = files
        config = json.loads(Path(files.config).read_text(encoding="utf-8"))
        self.vocab_size = int(config["vocab_size"])
        self.hidden_size = int(config["hidden_size"])
        self.model_id = model
        self.encoder_kwargs = dict(encoder_kwargs or {})
        self._rows: list[dict[str, Any]] = []

    def submit(self, todo: list[ChunkRecord], options: IngestOptions) -> Iterator[EncodeResult]:
        self._rows.extend(to_row(r) for r in todo)
        return iter(())

    def take_rows(self) -> list[dict[str, Any]]:
        """The rows collected so far, handed over once."""
        rows, self._rows = self._rows, []
        return rows

    def identity(self) -> ModelIdentity | None:
        from bgem3_embeddings.checkpoint.fingerprint import checkpoint_fingerprint

        precision = self.encoder_kwargs.get("precision")
        return ModelIdentity(
            model=self.model_id,
            fingerprint=checkpoint_fingerprint(self.files),
            precision=None if precision in (None, "auto") else str(precision),
            vocab_size=self.vocab_size,
        )
