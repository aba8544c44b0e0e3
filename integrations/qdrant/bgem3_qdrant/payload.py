"""The payload of a stored chunk: its field names, how it is built, and which fields are indexed.

Ingestion writes these fields, search reads them, filters tell them apart from document metadata, and
the LangChain and LlamaIndex retrievers copy some of them into their documents: all from here.
"""

from __future__ import annotations

from typing import Any, Literal

# Field names, as stored.
TEXT = "text"  # the exact chunk text that was encoded
SOURCE = "source"  # the file the document came from (absolute path), or what the caller gave
DOC_ID = "doc_id"  # the document's id: the file path, a JSONL `id`, or the caller's id
CHUNK_INDEX = "chunk_index"
CHUNK_COUNT = "chunk_count"
CHAR_START = "char_start"  # the chunk is document_text[char_start:char_end]
CHAR_END = "char_end"
N_TOKENS = "n_tokens"  # tokens of the chunk, special tokens excluded
CONTENT_HASH = "content_hash"  # SHA-256 of TEXT (part of the point id)
MODEL = "model"  # the model that wrote the vectors
METADATA = "metadata"  # the document's own metadata (an object)

# Every top-level field ingestion writes; a filter key outside this set refers to `metadata.<key>`.
TOP_LEVEL_FIELDS: tuple[str, ...] = (
    TEXT, SOURCE, DOC_ID, CHUNK_INDEX, CHUNK_COUNT, CHAR_START, CHAR_END,
    N_TOKENS, CONTENT_HASH, MODEL, METADATA,
)
# Fields a retriever copies next to the document metadata (where a chunk came from).
LOCATION_FIELDS: tuple[str, ...] = (SOURCE, DOC_ID, CHUNK_INDEX, CHUNK_COUNT, CHAR_START, CHAR_END)

IndexKind = Literal["keyword", "integer"]
# Payload indexes every collection gets: pruning and deleting filter on doc_id, users on source.
INDEXED_FIELDS: dict[str, IndexKind] = {DOC_ID: "keyword", SOURCE: "keyword"}
# Metadata keys indexed per collection at most (the first ones seen with keyword or integer values).
MAX_METADATA_INDEXES = 16


def chunk_payload(
    *,
    text: str,
    source: str,
    doc_id: str,
    chunk_index: int,
    chunk_count: int,
    char_start: int,
    char_end: int,
    n_tokens: int,
    content_hash: str,
    model: str,
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """The payload of one chunk, with every field of TOP_LEVEL_FIELDS."""
    return {
        TEXT: text,
        SOURCE: source,
        DOC_ID: doc_id,
        CHUNK_INDEX: chunk_index,
        CHUNK_COUNT: chunk_count,
        CHAR_START: char_start,
        CHAR_END: char_end,
        N_TOKENS: n_tokens,
        CONTENT_HASH: content_hash,
        MODEL: model,
        METADATA: metadata,
    }


def metadata_path(key: str) -> str:
    """The payload path a filter key refers to: a top-level field as is, anything else in metadata.

    >>> metadata_path("lang"), metadata_path("doc_id"), metadata_path("metadata.lang")
    ('metadata.lang', 'doc_id', 'metadata.lang')
    """
    if key in TOP_LEVEL_FIELDS or key.startswith(f"{METADATA}."):
        return key
    return f"{METADATA}.{key}"


def note_metadata_fields(metadata: dict[str, Any], seen: dict[str, IndexKind]) -> None:
    """Remember metadata keys with keyword or integer values (what `--filter key=value` matches)."""
    for key, value in metadata.items():
        if key in seen or len(seen) >= MAX_METADATA_INDEXES:
            continue
        if isinstance(value, str):
            seen[key] = "keyword"
        elif isinstance(value, int) and not isinstance(value, bool):
            seen[key] = "integer"


def wanted_indexes(metadata_fields: dict[str, IndexKind]) -> dict[str, IndexKind]:
    """Payload path -> index kind for a collection whose documents have these metadata keys."""
    return {**INDEXED_FIELDS, **{f"{METADATA}.{k}": v for k, v in metadata_fields.items()}}
