"""The store and the encoder behind the page: collections, a query searched in all four modes, explanations.

The store is opened at the first request that needs it, not at start: a store another process holds (an
ingest running) answers that request with one line (409), and the next request tries again. Every search
embeds the query once and runs dense, sparse, hybrid and rerank with that embedding, through the same
`Searcher.search` calls as `bgem3-qdrant search --mode M` (so the hits are the same, in the same order).
Highlighting the hits' matched sparse terms reads their stored sparse vectors; only opening a hit's
explanation encodes its text.

Every character offset in the answers (a term's `spans`, a token's `start` / `stop`) counts Unicode code
points, Python's str indices (`OFFSET_UNIT`, said in each answer); the page converts them to the UTF-16 units
of JavaScript strings (static/js/dom.js, `TextOffsets`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bgem3_embeddings.concurrency import encoder_lock
from bgem3_embeddings.explain import check_weights
from bgem3_embeddings.query_text import EmptyQueryError, check_query, empty_text, is_blank, query_cut_note
from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS

from ..cross_encoder import CROSS_ENCODER, RerankerLike, search_with_cross_encoder
from ..encoder import EncoderLike
from ..errors import BGEM3QdrantError
from ..filters import parse_filter_args
from ..identity import ensure_model, identity_of, stored_pooling
from ..inventory import describe_collection
from ..payload import CHUNK_INDEX, DOC_ID, SOURCE, TEXT
from ..search import Hit, Searcher
from ..stores.base import MODES, BGEM3Store, Mode
from ..stores.open import StoreTarget, open_store
from .errors import PageError
from .highlight import explained, hit_terms, lexical_dict, matched_only

MAX_QUERY_CHARS = 2_000
# The "explain a pair" box: a passage longer than this is refused (its heatmap would be thousands of
# columns); stored chunks are explained whatever their length, as the model sees them.
MAX_PASSAGE_CHARS = 8_000
MAX_LIMIT = 50
OFFSET_UNIT = "code point"  # of every span and token start / stop the API sends
DEFAULT_WEIGHTS = DEFAULT_MODE_WEIGHTS  # dense, sparse, ColBERT: the BAAI/bge-m3 model card's (scoring.py)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def check_text(value: Any, name: str, limit: int) -> str:
    """A non-empty str of at most `limit` characters, else PageError naming the field (a query: the rule
    every query follows, `check_query`)."""
    if not isinstance(value, str):
        raise PageError(400, f"{name} must be text, got {type(value).__name__}")
    if name == "query":
        try:
            check_query(value)
        except EmptyQueryError as e:
            raise PageError(400, str(e)) from e
    elif is_blank(value):  # the rule every text a user sends follows
        raise PageError(400, empty_text(f"the {name}"))
    if len(value) > limit:
        raise PageError(
            413, f"the {name} has {len(value):,} characters, over the page's limit of {limit:,}: shorten it"
        )
    return value


def check_weights_arg(value: Any) -> tuple[float, float, float]:
    if value is None:
        return DEFAULT_WEIGHTS
    try:
        return check_weights(value)
    except ValueError as e:
        raise PageError(400, str(e)) from e


def _point_id(value: Any) -> str:
    """A point id as the store takes it (a UUID or an unsigned integer)."""
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if text.isdigit():
        return text
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise PageError(400, f"point id {str(value)[:60]!r} is not a UUID or an unsigned integer") from None


class StoreSession:
    """One store (opened lazily) and one encoder, used by the page's requests one at a time."""

    def __init__(
        self,
        target: StoreTarget,
        encoder: EncoderLike,
        *,
        opener: Callable[[StoreTarget], BGEM3Store] = open_store,
        reranker: RerankerLike | None = None,
        rerank_candidates: int | None = None,
    ) -> None:
        """`reranker` (`--reranker`): a cross-encoder stage over each search (cross_encoder.py): the MCP
        `find` tool's hits are its order of the mode's top `rerank_candidates`, and the page shows it as a
        fifth column over the rerank mode's."""
        self.target = target
        self.encoder = encoder
        self.reranker = reranker
        self.rerank_candidates = rerank_candidates
        self._opener = opener
        self._store: BGEM3Store | None = None
        self._searchers: dict[str, Searcher] = {}
        # Edge runs in this process: its calls, and the searchers' once-only model checks, are serialised.
        self._lock = threading.RLock()
        self._identity = identity_of(encoder)
        self.query_max_length = int(getattr(encoder, "query_max_length", 512))
        self.passage_max_length = int(getattr(encoder, "passage_max_length", 8192))

    # -- the store
    def _open(self) -> BGEM3Store:
        if self._store is None:
            self._store = self._opener(self.target)  # StoreUnavailableError: the next request retries
            self._searchers.clear()
        return self._store

    @contextmanager
    def opened(self) -> Iterator[BGEM3Store]:
        """The store, opened if it is not yet, held by this session's lock (for writes: `store` of MCP)."""
        with self._lock:
            yield self._open()

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def info(self) -> dict[str, Any]:
        """What the page header shows: the store, the encoder's model, the limits of its inputs."""
        return {
            "store": self.target.describe(),
            "model": str(getattr(self.encoder, "model_id", "unknown")),
            "precision": getattr(self.encoder, "precision", None),
            "modes": [*MODES, CROSS_ENCODER] if self.reranker is not None else list(MODES),
            "reranker": getattr(self.reranker, "model_id", None),
            "limits": {
                "max_query_chars": MAX_QUERY_CHARS,
                "max_passage_chars": MAX_PASSAGE_CHARS,
                "max_limit": MAX_LIMIT,
            },
            "weights": list(DEFAULT_WEIGHTS),
        }

    def _check_model(self, store: BGEM3Store, name: str) -> None:
        """The Searcher's refusals (vector size, model identity) before anything is searched."""
        size = store.stored_schema(name).size
        hidden = int(self.encoder.hidden_size)
        if size != hidden:
            raise PageError(
                409,
                f"collection {name!r} holds vectors of size {size}, this page's model produces {hidden}: "
                "start the page with the model that wrote it (--model)",
            )
        ensure_model(store, name, self._identity, write=False)

    def _collection(self, store: BGEM3Store, name: str) -> None:
        if name not in store.list_collections():
            raise store.missing(name)

    def collections(self) -> list[dict[str, Any]]:
        """Each collection as `inventory.describe_collection` says it (chunks, model, storage, metadata
        keys), its `problem` also the reason it cannot be searched with this page's model."""
        with self._lock:
            store = self._open()
            return [self._describe(store, name) for name in store.list_collections()]

    def _describe(self, store: BGEM3Store, name: str) -> dict[str, Any]:
        out = describe_collection(store, name)
        if out["problem"] is None:
            try:
                self._check_model(store, name)
            except BGEM3QdrantError as e:  # readable, but not with this page's model
                out["problem"] = str(e)
        return out

    def _searcher(self, store: BGEM3Store, name: str) -> Searcher:
        self._collection(store, name)
        if name not in self._searchers:
            self._searchers[name] = Searcher(store, name, self.encoder)
        return self._searchers[name]

    # -- searching
    def search_mode(
        self, name: str, query: Any, mode: Mode, limit: int, filters: Sequence[str] = ()
    ) -> tuple[list[Hit], list[str]]:
        """One mode's hits, as `bgem3-qdrant search --mode M` gives them, and the filter keys no point has."""
        text = check_text(query, "query", MAX_QUERY_CHARS)
        if not 1 <= limit <= MAX_LIMIT:
            raise PageError(400, f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
        try:
            flt = parse_filter_args(list(filters))
        except ValueError as e:
            raise PageError(400, str(e)) from e
        with self._lock:
            searcher = self._searcher(self._open(), name)
            with encoder_lock(self.encoder):
                embedding = searcher.embed_query(text)
            hits = search_with_cross_encoder(
                searcher, text, self.reranker, limit=limit, rerank_candidates=self.rerank_candidates,
                mode=mode, filter=flt or None, embedding=embedding,
            )  # fmt: skip
            return hits, (searcher.missing_filter_keys(flt) if flt else [])

    def search(self, name: str, query: Any, filters: Sequence[str] = (), limit: int = 10) -> dict[str, Any]:
        """The hits of all four modes for one query embedding, with matched sparse terms and timings."""
        text = check_text(query, "query", MAX_QUERY_CHARS)
        if not 1 <= limit <= MAX_LIMIT:
            raise PageError(400, f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
        try:
            flt = parse_filter_args(list(filters))
        except ValueError as e:
            raise PageError(400, str(e)) from e
        t0 = time.perf_counter()
        with self._lock:
            searcher = self._searcher(self._open(), name)
            with encoder_lock(self.encoder):
                embedding = searcher.embed_query(text)
            t1 = time.perf_counter()
            results: dict[str, list[Hit]] = {}
            search_ms: dict[str, float] = {}
            for mode in MODES:
                t = time.perf_counter()
                results[mode] = searcher.search(
                    text, mode=mode, limit=limit, filter=flt or None, embedding=embedding
                )
                search_ms[mode] = _ms(time.perf_counter() - t)
            if self.reranker is not None:  # the cross-encoder's order of the rerank mode's top candidates
                t = time.perf_counter()
                results[CROSS_ENCODER] = search_with_cross_encoder(
                    searcher, text, self.reranker, limit=limit, rerank_candidates=self.rerank_candidates,
                    mode="rerank", filter=flt or None, embedding=embedding,
                )  # fmt: skip
                search_ms[CROSS_ENCODER] = _ms(time.perf_counter() - t)
            t2 = time.perf_counter()
            missing = searcher.missing_filter_keys(flt) if flt else []
            sparse_name = searcher.schema.sparse_name
            # What makes a search score differ from the explanation's (the page says so beside them).
            scoring = {"colbert_pooling": stored_pooling(searcher.store, name),
                       "sparse_modifier": searcher.store.stored_schema(name).sparse_modifier}  # fmt: skip
        t3 = time.perf_counter()
        terms = self._terms(text, lexical_dict(embedding.sparse), results, sparse_name)
        t4 = time.perf_counter()
        return {
            "collection": name,
            "query": text,
            "offset_unit": OFFSET_UNIT,
            "scoring": scoring,
            "modes": {
                mode: [self._hit(rank, h, terms[h.id]) for rank, h in enumerate(hits, start=1)]
                for mode, hits in results.items()
            },
            "warnings": [
                f"no point of {name!r} has the filter key {key!r}: the search runs but cannot match it"
                for key in missing
            ]
            + ([cut] if (cut := query_cut_note(self.encoder, text)) else []),
            "timing": {
                "embed_ms": _ms(t1 - t0),
                "search_ms": search_ms,
                # What `bgem3-qdrant search` would spend: one embedding and the four searches.
                "searched_ms": _ms(t2 - t0),
                "highlight_ms": _ms(t4 - t3),
                "server_ms": _ms(t4 - t0),
            },
        }

    def _terms(
        self, query: str, query_weights: dict[str, float], results: dict[str, list[Hit]], sparse_name: str
    ) -> dict[str, list[dict[str, Any]]]:
        """Every distinct hit's matched sparse terms. Only hits sharing a token id with the query are
        tokenized (in one call): the others have nothing to highlight."""
        weights = {h.id: lexical_dict(h.vectors.get(sparse_name)) for hits in results.values() for h in hits}
        terms: dict[str, list[dict[str, Any]]] = {hid: [] for hid in weights}
        shared = {hid: {int(k) for k in query_weights.keys() & w.keys()} for hid, w in weights.items()}
        texts = {h.id: h.text for hits in results.values() for h in hits if shared[h.id]}
        if not texts:
            return terms
        tokenizer = self.encoder.tokenizer
        q = explained(tokenizer, [query], self.query_max_length)[0]
        passages = matched_only(
            tokenizer, q, list(texts.values()), [shared[hid] for hid in texts], self.passage_max_length
        )
        for hid, passage in zip(texts, passages, strict=True):
            terms[hid] = hit_terms(q, query_weights, passage, weights[hid])
        return terms

    @staticmethod
    def _hit(rank: int, hit: Hit, terms: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rank": rank, **hit.to_dict(), "terms": terms}

    # -- explanations
    def explain_hit(self, name: str, point_id: Any, query: Any, weights: Any = None) -> dict[str, Any]:
        """Why a stored chunk scores what it scores against the query: its text encoded with the query."""
        text = check_text(query, "query", MAX_QUERY_CHARS)
        checked = check_weights_arg(weights)
        passage, hit = self.stored_chunk(name, point_id)
        return {**self._explain(text, passage, checked), "hit": hit}

    def stored_chunk(self, name: str, point_id: Any) -> tuple[str, dict[str, Any]]:
        """A stored chunk's text and where it came from (id, source, doc_id, chunk_index)."""
        pid = _point_id(point_id)
        with self._lock:
            store = self._open()
            self._collection(store, name)
            self._check_model(store, name)
            points = store.retrieve(name, [pid], with_payload=True)
        if not points:
            raise PageError(404, f"no point {pid} in collection {name!r}: search again (it may have been "
                                 "re-ingested meanwhile)")  # fmt: skip
        payload = points[0].payload
        passage = str(payload.get(TEXT) or "")
        if not passage.strip():
            raise PageError(400, f"point {pid} of {name!r} stores no text to explain (ingest records it)")
        hit = {"id": pid, "source": payload.get(SOURCE), "doc_id": payload.get(DOC_ID),
               "chunk_index": payload.get(CHUNK_INDEX)}  # fmt: skip
        return passage, hit

    def explain_pair(self, query: Any, passage: Any, weights: Any = None) -> dict[str, Any]:
        """Why a passage someone typed scores what it scores against a query."""
        text = check_text(query, "query", MAX_QUERY_CHARS)
        body = check_text(passage, "passage", MAX_PASSAGE_CHARS)
        return self._explain(text, body, check_weights_arg(weights))

    def _explain(self, query: str, passage: str, weights: tuple[float, float, float]) -> dict[str, Any]:
        explain_many = getattr(self.encoder, "explain_many", None)
        if not callable(explain_many):
            raise PageError(400, f"the encoder ({type(self.encoder).__name__}) cannot explain scores")
        t0 = time.perf_counter()
        with encoder_lock(self.encoder):
            explanation = explain_many(query, [passage], weights=weights, colbert_matrix=True)[0]
        out: dict[str, Any] = {**explanation.to_dict(), "offset_unit": OFFSET_UNIT}
        out["timing"] = {"explain_ms": _ms(time.perf_counter() - t0)}
        return out
