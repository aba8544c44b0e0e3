"""The plain engine: the encoder runs in this process, one batch at a time, while the writer thread stores
the previous batch and checks the next one."""

from __future__ import annotations

from collections.abc import Iterator

from ..encoder import EncoderLike
from ..identity import ModelIdentity, identity_of
from .encoding import Destination, EncodeResult, Encoding, encode_records
from .options import IngestOptions
from .plan import ChunkRecord


class PlainEncoding(Encoding):
    """Encoding with a loaded encoder (a BGEM3Encoder) in this process.

    Ingestor(store, "kb", encoder) wraps the encoder in one:

    >>> Ingestor(store, "kb", PlainEncoding(encoder))   # doctest: +SKIP
    """

    def __init__(self, encoder: EncoderLike) -> None:
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.hidden_size = int(encoder.hidden_size)
        self.model_id = str(getattr(encoder, "model_id", "unknown"))

    def identity(self) -> ModelIdentity | None:
        return identity_of(self.encoder)

    def submit(self, todo: list[ChunkRecord], options: IngestOptions) -> Iterator[EncodeResult]:
        if todo:
            yield encode_records(self.encoder, todo, options)

    def finish(self, options: IngestOptions, destination: Destination) -> Iterator[EncodeResult]:
        return iter(())
