"""The encoder as a distributed engine's worker runs it (a Ray actor, a Spark Python worker).

`WorkerEncoder` loads the checkpoint once, checks that it is the one the driver planned with (its
fingerprint), and encodes the rows it is handed (rows.py's columns in, with vectors out). Each engine
names where it runs (`where`, for messages). `WorkerEncoders` keeps one encoder per model and settings in a
worker process that runs many tasks (Spark reuses its Python workers; a Ray actor holds its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..encoder import EncoderLike, load_encoder
from ..errors import BGEM3QdrantError
from .encoding import encode_records
from .options import IngestOptions
from .plan import ChunkRecord
from .rows import pack


class CheckpointMismatchError(BGEM3QdrantError):
    """A worker's checkpoint is not the one the driver planned with (other files on its node)."""


class WorkerEncoder:
    """One encoder, built once; called with a batch of rows, returns them with their vectors."""

    def __init__(
        self,
        model: str,
        options: IngestOptions,
        encoder_kwargs: dict[str, Any],
        fingerprint: str | None = None,
    ) -> None:
        self.encoder: EncoderLike = load_encoder(model, **encoder_kwargs)
        self.options = options
        self.mismatch: str | None = None
        loaded = getattr(self.encoder, "fingerprint", None)
        if fingerprint is not None and callable(loaded) and loaded() != fingerprint:
            # Raised with the first batch: an error while starting would only make Ray start it again.
            self.mismatch = (
                f"the encoder on {self.where()} loaded other checkpoint files for {model!r} than "
                f"the driver (fingerprint {loaded()[:12]}, driver {fingerprint[:12]}): every node must see "
                "the same checkpoint (one shared path, or the same hub revision in each node's cache)"
            )

    @staticmethod
    def where() -> str:
        """Where this encoder runs, for messages: each engine's subclass names its worker."""
        return "a worker"

    def __call__(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.mismatch is not None:
            raise CheckpointMismatchError(self.mismatch)
        records = [ChunkRecord(str(i), str(t), {}, 0) for i, t in zip(cols["id"], cols["text"], strict=True)]
        return pack(cols, encode_records(self.encoder, records, self.options))


T = TypeVar("T")


class WorkerEncoders:
    """Encoders kept for the life of a worker process, one per (model, settings): a Python worker that Spark
    reuses for task after task loads the checkpoint once.

        >>> encoders = WorkerEncoders()
        >>> encoders.get(["tiny", {}], lambda: "an encoder") is encoders.get(["tiny", {}], lambda: "other")
        True
    """

    def __init__(self) -> None:
        self._built: dict[str, Any] = {}

    def get(self, key: list[Any], build: Callable[[], T]) -> T:
        name = json.dumps(key, sort_keys=True, default=str)
        if name not in self._built:
            self._built[name] = build()
        return self._built[name]
