"""The encoding step of an ingestion: chunk records in, encoded batches out, wherever the encoder runs.

Both engines implement `Encoding`; the plan before it and the writer after it are the same for both:

    plain.PlainEncoding   the encoder in this process, one batch at a time
    ray.RayEncoding       a Ray Data actor pool, fed with every chunk to encode, results streamed back
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..encoder import EncodedTexts, EncoderLike, encode_texts
from ..identity import ModelIdentity
from ..schema import CollectionSchema
from ..stores.base import BGEM3Store
from .options import IngestOptions
from .plan import ChunkRecord


@dataclass
class EncodedBatch:
    """Chunks with their three BGE-M3 representations, ready to become points."""

    ids: list[str]
    payloads: list[dict[str, Any]]
    vectors: EncodedTexts
    tokens: int  # tokens the encoder ran on (special tokens included)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class WrittenBatch:
    """Chunks an engine encoded and wrote itself (Ray's writer actors on a server)."""

    count: int
    tokens: int


EncodeResult = EncodedBatch | WrittenBatch


@dataclass(frozen=True)
class Destination:
    """Where the ingestion writes: what an engine that writes by itself needs to know."""

    store: BGEM3Store
    collection: str
    schema: CollectionSchema
    colbert_pooling: int = 1  # the collection's ColBERT pooling factor (writers apply it)


def encode_records(encoder: EncoderLike, records: list[ChunkRecord], options: IngestOptions) -> EncodedBatch:
    """One encoder call for all three outputs of some chunk records."""
    vectors = encode_texts(
        encoder,
        [r.text for r in records],
        query=False,
        max_length=options.max_length,
        batch_size=options.encoder_batch_size,
    )
    return EncodedBatch(
        ids=[r.id for r in records],
        payloads=[r.payload for r in records],
        vectors=vectors,
        tokens=sum(r.encoded_tokens for r in records),
    )


class Encoding(ABC):
    """Where encoding runs. `tokenizer` chunks on the caller's side, `hidden_size` sizes the collection.

    The ingestor hands over each batch's records to encode (`submit`), then calls `finish` once with the
    destination; both yield results as they are ready: EncodedBatch for the ingestor's writer, or
    WrittenBatch where the engine wrote them itself.
    """

    tokenizer: Any
    hidden_size: int
    model_id: str

    @abstractmethod
    def identity(self) -> ModelIdentity | None:
        """The model this engine encodes with (None: it cannot tell its weights)."""

    @abstractmethod
    def submit(self, todo: list[ChunkRecord], options: IngestOptions) -> Iterator[EncodeResult]: ...

    @abstractmethod
    def finish(self, options: IngestOptions, destination: Destination) -> Iterator[EncodeResult]: ...
