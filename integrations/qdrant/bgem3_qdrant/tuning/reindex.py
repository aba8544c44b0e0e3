"""A collection re-encoded by another model: `bgem3-qdrant reindex -c OLD --model DIR --into NEW`.

The texts and metadata come from the old collection's payloads (no source files): each point is encoded
again by the new model and written under the same id, with the same payload (its `model` field names the
new model, as ingest's payloads name theirs), into a new collection with the old one's storage (schema:
vector names, ColBERT dtype and quantized copy, on-disk choices, sparse modifier; the ColBERT pooling
factor from its model record). The old collection is only read.

Chunk boundaries and `n_tokens` were decided by the old model's tokenizer, so a model with another
tokenizer is refused (its chunks would need cutting again: that is an ingest of the sources).

Resumable like ingest: points already in NEW are skipped, so a run killed half way continues with
`resume=True` (`--resume`); NEW records which collection it was made from, and a resume from another one
is refused.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..encoder import EncoderLike, encode_texts
from ..errors import BGEM3QdrantError
from ..identity import ModelIdentity, ensure_model, identity_of, payload_models, stored_identity
from ..ingest.encoding import EncodedBatch
from ..ingest.options import SPECIAL_TOKENS, IngestOptions
from ..ingest.writer import ensure_payload_indexes, optimize_with_progress, to_points
from ..payload import METADATA, MODEL, N_TOKENS, TEXT, IndexKind, note_metadata_fields
from ..retry import call_with_retries
from ..schema import CollectionSchema
from ..stores.base import BGEM3Store, ensure_collection
from ..stores.open import as_store

logger = logging.getLogger(__name__)
# The key a reindexed collection's model record names its source collection under (a resume checks it).
SOURCE_KEY = "reindexed_from"


class ReindexError(BGEM3QdrantError):
    """A reindex that cannot start (bad --into, another tokenizer, ...); nothing was written."""


@dataclass
class ReindexSummary:
    """What a reindex did: `encoded` points written by this run, `skipped` already in `into` (a resume)."""

    collection: str
    into: str
    model: str
    points: int = 0
    encoded: int = 0
    skipped: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def format(self) -> str:
        rate = f", {self.tokens / self.seconds:.0f} tokens/s" if self.seconds > 0 and self.tokens else ""
        resumed = f" ({self.skipped} already there)" if self.skipped else ""
        return (
            f"{self.collection!r} -> {self.into!r} with {self.model}: {self.points} points, "
            f"{self.encoded} encoded{resumed} in {self.seconds:.1f}s{rate}"
        )


def tokenizer_digest(root: Path) -> str:
    """SHA-256 over a checkpoint folder's tokenizer files (those `checkpoint_fingerprint` hashes)."""
    from bgem3_embeddings.checkpoint.files import TOKENIZER_FILES

    h = hashlib.sha256()
    for name in sorted(TOKENIZER_FILES):
        path = root / name
        if path.is_file():
            h.update(f"\0{name}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _recorded_tokenizer(model: str) -> str | None:
    """The tokenizer digest of the recorded model `model` when its files are on this machine (a folder,
    `tiny`, a hub id in the cache), else None (nothing is downloaded)."""
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint

    try:
        return tokenizer_digest(resolve_checkpoint(model, local_files_only=True).root)
    except Exception as e:  # noqa: BLE001 - any reason the files are not here means "cannot compare"
        logger.info("cannot read the tokenizer of %s here (%s): comparing vocabulary sizes only", model, e)
        return None


def tokenizer_problem(
    collection: str,
    recorded: ModelIdentity | None,
    old_model: str,
    new_root: Path | None,
    new_vocab: int | None,
) -> str | None:
    """Why the model in `new_root` (vocabulary `new_vocab`) has not the tokenizer that cut `collection`'s
    chunks (None: the same, as far as can be told: the vocabulary sizes, and the tokenizer files when the
    recorded model `old_model` is on this machine)."""
    why = None
    if recorded is not None and recorded.vocab_size and new_vocab and recorded.vocab_size != new_vocab:
        why = f"a vocabulary of {new_vocab} tokens, not {recorded.vocab_size}"
    elif new_root is not None:
        have = _recorded_tokenizer(old_model)
        if have is not None and tokenizer_digest(new_root) != have:
            why = "other tokenizer files"
    if why is None:
        return None
    return (
        f"the model (--model) has another tokenizer than {old_model}, which cut collection {collection!r} "
        f"into chunks ({why}): its chunks would not match; re-ingest the sources with it instead "
        f"(`bgem3-qdrant ingest PATH --model MODEL -c NEW`)"
    )


def check_model(store: Any, collection: str, model: str) -> None:
    """The tokenizer check of `reindex_collection` from the checkpoint's files alone (no weights load):
    ReindexError naming the difference. `collection` must exist."""
    import json

    from bgem3_embeddings.checkpoint.files import resolve_checkpoint

    st = as_store(store)
    files = resolve_checkpoint(model)
    vocab = json.loads(files.config.read_text(encoding="utf-8")).get("vocab_size")
    recorded = stored_identity(st, collection)
    old_model = _source_model(st, collection, recorded)
    problem = tokenizer_problem(collection, recorded, old_model, files.root, vocab)
    if problem:
        raise ReindexError(problem)


def _source_model(store: BGEM3Store, collection: str, recorded: ModelIdentity | None) -> str:
    if recorded is not None:
        return recorded.model
    names = payload_models(store, collection, limit=256)
    return min(names) if names else "an unrecorded model"


def check_reindex(store: Any, collection: str, into: str, *, resume: bool = False) -> None:
    """The checks that need no model: `into` is not `collection`, `collection` exists, `into` does not
    (unless `resume`: then it must be a reindex of `collection`). ReindexError / CollectionNotFoundError."""
    st = as_store(store)
    if into == collection:
        raise ReindexError(
            f"--into {into!r} is the collection being re-indexed (-c): name a new collection; the old one is "
            "kept as it is, to compare (`bgem3-qdrant eval`) and to switch back to"
        )
    if not st.collection_exists(collection):
        raise st.missing(collection)
    if not st.collection_exists(into):
        return
    if not resume:
        raise ReindexError(
            f"collection {into!r} exists already (--into): nothing was changed; continue an interrupted "
            "reindex into it with --resume, or name a new collection (or drop it: "
            f"`bgem3-qdrant drop -c {into}`)"
        )
    record = st.read_model_record(into) or {}
    source = record.get(SOURCE_KEY)
    if source != collection:
        made = f"a reindex of {source!r}" if source else "not made by reindex"
        raise ReindexError(
            f"collection {into!r} (--into) is {made}, so --resume cannot continue a reindex of "
            f"{collection!r} into it; name a new collection"
        )


def reindex_collection(
    store: Any,
    collection: str,
    encoder: EncoderLike,
    into: str,
    *,
    model_id: str | None = None,
    resume: bool = False,
    batch_size: int = 32,
    show_progress: bool | None = None,
) -> ReindexSummary:
    """Re-encode every point of `collection` with `encoder` into the new collection `into` (see the module
    docstring). `model_id` is the name recorded for the new vectors (default: the encoder's `model_id`);
    `resume` continues a reindex into an existing `into`. The old collection is only read.

    Raises ReindexError (one line, nothing written) for an `into` that exists without `resume`, `into` ==
    `collection`, or a model with another tokenizer; CollectionNotFoundError for a missing `collection`.
    """
    st = as_store(store)
    started = time.perf_counter()
    check_reindex(st, collection, into, resume=resume)
    recorded = stored_identity(st, collection)
    old_model = _source_model(st, collection, recorded)
    model = model_id or str(getattr(encoder, "model_id", "unknown"))
    identity = identity_of(encoder, model)
    root = getattr(getattr(encoder, "files", None), "root", None)
    new_root = None if root is None else Path(root)
    new_vocab = identity.vocab_size if identity is not None else None
    problem = tokenizer_problem(collection, recorded, old_model, new_root, new_vocab)
    if problem:
        raise ReindexError(problem)
    pooling = recorded.colbert_pooling if recorded is not None else 1
    schema = replace(st.stored_schema(collection), size=int(encoder.hidden_size))
    summary = ReindexSummary(collection, into, model, points=st.count(collection))
    ensure_collection(st, into, schema)  # checks an existing one's schema (resume)
    if identity is not None:
        identity = replace(identity, colbert_pooling=pooling)
        ensure_model(st, into, identity, write=False)  # a resume by another model is refused
        if st.read_model_record(into) is None:
            st.write_model_record(into, {**identity.to_dict(), SOURCE_KEY: collection})
    elif st.read_model_record(into) is None:
        st.write_model_record(into, {"model": model, "colbert_pooling": pooling, SOURCE_KEY: collection})
    fields: dict[str, IndexKind] = {}
    bar = _progress_bar(show_progress, summary.points)
    try:
        page: list[Any] = []
        for point in st.iter_points(collection, with_payload=True, page=max(batch_size, 64)):
            page.append(point)
            if len(page) == batch_size:
                _reindex_batch(st, into, encoder, schema, pooling, model, page, fields, summary, bar)
                page = []
        if page:
            _reindex_batch(st, into, encoder, schema, pooling, model, page, fields, summary, bar)
    finally:
        bar.close()
    ensure_payload_indexes(st, into, fields)
    if summary.encoded >= IngestOptions().optimize_after:
        optimize_with_progress(st, into, show_progress)
    summary.seconds = time.perf_counter() - started
    logger.info("reindex %s", summary.format())
    return summary


def _reindex_batch(
    store: BGEM3Store,
    into: str,
    encoder: EncoderLike,
    schema: CollectionSchema,
    pooling: int,
    model: str,
    points: list[Any],
    fields: dict[str, IndexKind],
    summary: ReindexSummary,
    bar: Any,
) -> None:
    """Encode and write the points of one page that `into` does not hold yet."""
    for p in points:
        metadata = p.payload.get(METADATA)
        if isinstance(metadata, dict):
            note_metadata_fields(metadata, fields)
    there = {r.id for r in store.retrieve(into, [p.id for p in points], with_payload=False)}
    todo = [p for p in points if p.id not in there]
    summary.skipped += len(points) - len(todo)
    if todo:
        texts = [str(p.payload.get(TEXT, "")) for p in todo]
        n_tokens = [int(p.payload.get(N_TOKENS) or 0) for p in todo]
        # The chunk was cut to n_tokens by the same tokenizer; re-tokenising its text may add a token or
        # two at the edges (IngestOptions.max_length allows 8), and a longer max_length truncates nothing.
        max_length = max(n_tokens) + SPECIAL_TOKENS + 8
        vectors = encode_texts(encoder, texts, query=False, max_length=max_length, batch_size=len(texts))
        batch = EncodedBatch(
            ids=[p.id for p in todo],
            payloads=[{**p.payload, MODEL: model} for p in todo],
            vectors=vectors,
            tokens=sum(n + SPECIAL_TOKENS for n in n_tokens),
        )
        written = to_points(batch, schema, pooling)
        call_with_retries(lambda: store.upsert(into, written), what="upsert")
        summary.encoded += len(todo)
        summary.tokens += batch.tokens
    bar.update(len(points))


def _progress_bar(show: bool | None, total: int) -> Any:
    from tqdm.auto import tqdm

    enabled = show if show is not None else sys.stderr.isatty()
    return tqdm(total=total, unit="chunk", desc="reindex", disable=not enabled, dynamic_ncols=True)
