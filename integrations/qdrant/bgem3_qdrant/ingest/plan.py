"""The plan of an ingestion, shared by both engines: documents -> chunks -> point ids -> what is stored.

Nothing here encodes or writes: the plan says which chunks need encoding (`PlanStep.todo`), which only
need their payload replaced (`relabel`), and which are stored as they are (`unchanged`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..chunking import Chunker
from ..errors import SourceError
from ..ids import content_hash, point_id
from ..payload import IndexKind, chunk_payload, note_metadata_fields
from ..sources import Document
from .options import SPECIAL_TOKENS, IngestOptions


@dataclass
class ChunkRecord:
    """A chunk about to be stored: its point id, text and payload."""

    id: str
    text: str
    payload: dict[str, Any]
    n_tokens: int  # special tokens excluded

    @property
    def encoded_tokens(self) -> int:
        """Tokens the encoder runs on for this chunk (<s> and </s> included)."""
        return self.n_tokens + SPECIAL_TOKENS


@dataclass
class PlanStep:
    """One batch of records split by what the store already holds."""

    batch: list[ChunkRecord]
    todo: list[ChunkRecord] = field(default_factory=list)  # to encode and write
    relabel: list[ChunkRecord] = field(default_factory=list)  # vectors valid, payload changed
    unchanged: int = 0


class IngestPlan:
    """Chunks documents into records with stable point ids, in batches, and classifies them.

    While iterating it records each document's point ids (`doc_points`, for pruning chunks that no
    longer exist), the filterable metadata keys seen (`metadata_fields`, for payload indexes) and the
    documents that gave no chunk (`empty`).
    """

    def __init__(self, tokenizer: Any, options: IngestOptions, model_id: str) -> None:
        self.chunker = Chunker(tokenizer, options.chunk_size, options.chunk_overlap)
        self.options = options
        self.model_id = model_id
        self.doc_points: dict[str, set[str]] = {}
        self.metadata_fields: dict[str, IndexKind] = {}
        self.empty = 0

    def records(self, docs: Iterable[Document]) -> Iterator[ChunkRecord]:
        """Chunk records of documents, in order."""
        for doc in docs:
            chunks = self.chunker(doc.text)
            if not chunks:
                self.empty += 1
                continue
            note_metadata_fields(doc.metadata, self.metadata_fields)
            ids: set[str] = set()
            for ch in chunks:
                h = content_hash(ch.text)
                pid = point_id(doc.doc_id, ch.index, h)
                ids.add(pid)
                payload = chunk_payload(
                    text=ch.text,
                    source=doc.source,
                    doc_id=doc.doc_id,
                    chunk_index=ch.index,
                    chunk_count=len(chunks),
                    char_start=ch.start,
                    char_end=ch.end,
                    n_tokens=ch.n_tokens,
                    content_hash=h,
                    model=self.model_id,
                    metadata=doc.metadata,
                )
                yield ChunkRecord(pid, ch.text, payload, ch.n_tokens)
            # A later record with the same document id replaces the earlier one (the last one wins).
            self.doc_points[doc.doc_id] = ids

    def batches(self, docs: Iterable[Document]) -> Iterator[list[ChunkRecord]]:
        """Records in batches of `batch_size`; if reading fails, the records read so far come out first,
        then the SourceError."""
        size = self.options.batch_size
        buf: list[ChunkRecord] = []
        try:
            for r in self.records(docs):
                buf.append(r)
                if len(buf) == size:
                    yield buf
                    buf = []
        except SourceError:
            if buf:
                yield buf
            raise
        if buf:
            yield buf

    def classify(self, batch: list[ChunkRecord], stored: Mapping[str, dict[str, Any]]) -> PlanStep:
        """Split a batch given the payloads stored under its ids.

        The id already encodes document, position and content, and a collection holds one model's
        vectors (identity.py), so a stored id means the stored vectors are valid.
        """
        step = PlanStep(batch)
        seen: set[str] = set()
        for r in batch:
            if r.id in seen:  # the same chunk twice in one batch (duplicate documents)
                step.unchanged += 1
                continue
            seen.add(r.id)
            have = stored.get(r.id)
            if have is None:
                step.todo.append(r)
            elif have != r.payload:
                step.relabel.append(r)
            else:
                step.unchanged += 1
        return step
