"""`bgem3-qdrant eval`: retrieval quality of every search mode on a BEIR-format dataset, per collection.

beir.py      the dataset folder: judged queries and graded qrels (the corpus is ingested by sources.py)
modes.py     one document ranking per query and mode, from the stored vectors
cross_mode.py  the cross-encoder mode (`--reranker`): the rerank mode's top chunks ordered by it
metrics.py   nDCG@10, Recall@100, MRR@10 from pytrec_eval, trec_eval's conventions
runs.py      TREC run files (`DIR/<mode>.trec`)
report.py    tables, side-by-side comparison with paired differences, JSON
significance.py  whether a paired difference is beyond chance (sign-flip permutation test)

>>> from bgem3_qdrant.evaluation import evaluate                     # doctest: +SKIP
>>> report = evaluate(store, ["scifact"], encoder, "datasets/scifact")  # doctest: +SKIP
>>> print(report.format())                                          # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cross_encoder import DEFAULT_RERANK_CANDIDATES
from ..encoder import EncoderLike, encode_texts
from ..errors import BGEM3QdrantError
from ..filters import doc_filter
from ..identity import stored_pooling
from ..ingest import IngestOptions, Ingestor
from ..payload import DOC_ID
from ..schema import CollectionSchema
from ..search import QueryEmbedding, Searcher
from ..stores.open import as_store
from .beir import BeirDataset, load_beir
from .cross_mode import CROSS_MODE, cross_scores
from .metrics import per_query, trec_order
from .modes import DEFAULT_WEIGHTS, EVAL_MODES, ModeSettings, Query, queries_from, search_mode
from .report import CollectionResult, EvalReport, ModeResult
from .runs import write_run

logger = logging.getLogger(__name__)


@dataclass
class EvalOptions:
    """What an evaluation runs: the split, the modes, candidates and depth (`settings`), and where the
    run files go (`run_dir`: DIR/<mode>.trec; DIR/<collection>/<mode>.trec when several collections)."""

    split: str = "test"
    modes: tuple[str, ...] = EVAL_MODES
    settings: ModeSettings = field(default_factory=ModeSettings)
    ignore_identical_ids: bool = False  # BEIR's evaluation drops documents whose id is the query's
    query_batch_size: int = 32
    show_progress: bool | None = None  # None: on a terminal
    run_dir: Path | None = None
    reranker: Any = None  # a BGEM3Reranker: the cross mode (cross_mode.py)
    rerank_candidates: int = DEFAULT_RERANK_CANDIDATES


def check_modes(modes: Sequence[str], reranker: bool = False) -> tuple[str, ...]:
    """The modes in EVAL_MODES order (then the cross mode), or ValueError naming the option; the cross
    mode needs a reranker."""
    known = (*EVAL_MODES, CROSS_MODE)
    unknown = [m for m in modes if m not in known]
    if unknown or not modes:
        raise ValueError(f"--modes takes {', '.join(known)}, not {', '.join(unknown) or 'nothing'}")
    if CROSS_MODE in modes and not reranker:
        raise ValueError(
            f"--modes {CROSS_MODE} orders the rerank mode's top chunks by a cross-encoder: give it with "
            "--reranker BAAI/bge-reranker-v2-m3 (or a folder)"
        )
    return tuple(m for m in known if m in modes)


def _progress(total: int, show: bool | None) -> Any:
    from tqdm.auto import tqdm

    enabled = show if show is not None else sys.stderr.isatty()
    return tqdm(total=total, unit="query", desc="eval", disable=not enabled, dynamic_ncols=True)


def _prepare(
    store: Any,
    name: str,
    encoder: EncoderLike,
    data: BeirDataset,
    schema: CollectionSchema | None,
    ingest_options: IngestOptions | None,
    model_id: str | None,
) -> str | None:
    """Ingest the corpus into collection `name` if it is missing or empty; the summary line, or None."""
    if store.collection_exists(name) and store.count(name) > 0:
        return None
    _check_fillable(name, data)
    logger.info("collection %s is empty: ingesting %s", name, data.corpus)
    ingestor = Ingestor(store, name, encoder, schema, ingest_options, model_id)
    return ingestor.ingest_paths([data.corpus]).format()


def _check_fillable(name: str, data: BeirDataset) -> None:
    """An empty or missing collection is filled from the dataset's corpus.jsonl: refused without one."""
    if not data.corpus.is_file():
        raise BGEM3QdrantError(
            f"collection {name!r} is empty or missing and {data.corpus} is not there to fill it "
            "(--collection): evaluate a collection that holds the dataset's documents, or add its "
            "corpus.jsonl"
        )


def judged_in_collection(store: Any, name: str, data: BeirDataset) -> tuple[int, int]:
    """(documents the qrels judge that collection `name` holds, documents the qrels judge)."""
    judged = sorted({doc for docs in data.qrels.values() for doc in docs})
    found: set[str] = set()
    for start in range(0, len(judged), 1000):
        flt = doc_filter(judged[start : start + 1000])
        points = store.iter_points(name, filter=flt, with_payload=[DOC_ID])
        found.update(str(p.payload.get(DOC_ID)) for p in points)
    return len(found), len(judged)


def check_corpus(store: Any, collections: Sequence[str], data: BeirDataset) -> list[str]:
    """Refuse a collection holding none of the documents the qrels judge (another corpus: every measure
    would be 0); a warning line for one holding only some. Empty or missing collections are skipped (eval
    fills them from the corpus)."""
    warnings = []
    for name in collections:
        if not store.collection_exists(name) or store.count(name) == 0:
            _check_fillable(name, data)
            continue
        found, judged = judged_in_collection(store, name, data)
        if found == 0:
            raise BGEM3QdrantError(
                f"collection {name!r} holds none of the {judged} documents {data.name}'s qrels judge "
                f"(--collection): it holds another corpus, and every measure would be 0; evaluate a "
                f"collection of this dataset: pass a new name, e.g. -c {data.name}, and eval ingests "
                f"{data.corpus} into it first"
            )
        if found < judged:
            warnings.append(
                f"collection {name!r} holds {found} of the {judged} documents {data.name}'s qrels judge: "
                "the missing ones count as not retrieved"
            )
    return warnings


def evaluate(
    store: Any,
    collections: Sequence[str],
    encoder: EncoderLike,
    dataset: str | Path | BeirDataset,
    *,
    options: EvalOptions | None = None,
    ingest_options: IngestOptions | None = None,
    schema: CollectionSchema | None = None,
    model_id: str | None = None,
) -> EvalReport:
    """Run every judged query of `dataset` in every mode on each collection (the first is the baseline).

    A missing or empty collection is filled from the dataset's corpus.jsonl first (`ingest_options`,
    `schema`); one holding none of the judged documents is refused (`check_corpus`). Queries are encoded
    once; each mode's latency is its search alone.
    """
    opts = options or EvalOptions()
    modes = check_modes(opts.modes, reranker=opts.reranker is not None)
    if not collections:
        raise BGEM3QdrantError("no collection to evaluate (--collection): pass -c NAME (several to compare)")
    if len(set(collections)) != len(collections):
        raise BGEM3QdrantError("a collection is named twice (--collection): name each one once")
    st = as_store(store)
    data = dataset if isinstance(dataset, BeirDataset) else load_beir(dataset, opts.split)
    model = model_id or str(getattr(encoder, "model_id", "unknown"))
    ingested = {
        name: _prepare(st, name, encoder, data, schema, ingest_options, model_id) for name in collections
    }
    warnings = check_corpus(st, collections, data)  # the report carries the warnings

    ids, texts = list(data.queries), list(data.queries.values())
    started = time.perf_counter()
    queries = queries_from(ids, encode_texts(encoder, texts, query=True, batch_size=opts.query_batch_size))
    encode_seconds = time.perf_counter() - started

    results: list[CollectionResult] = []
    bar = _progress(len(queries) * len(modes) * len(collections), opts.show_progress)
    try:
        for name in collections:
            result = _evaluate_collection(st, name, encoder, data, queries, modes, opts, bar)
            result.ingested = ingested[name]
            results.append(result)
    finally:
        bar.close()
    report = EvalReport(
        dataset=data.name,
        split=data.split,
        model=model,
        store=st.describe(),
        queries=len(queries),
        relevant_queries=data.relevant_queries(),
        settings=opts.settings,
        ignore_identical_ids=opts.ignore_identical_ids,
        encode_seconds=encode_seconds,
        collections=results,
        warnings=warnings,
    )
    if opts.run_dir is not None:
        report.run_files = _write_runs(opts.run_dir, report)
    return report


def _evaluate_collection(
    store: Any,
    name: str,
    encoder: EncoderLike,
    data: BeirDataset,
    queries: list[Query],
    modes: tuple[str, ...],
    opts: EvalOptions,
    bar: Any,
) -> CollectionResult:
    schema = store.stored_schema(name)
    # One search first: it checks that this model wrote the collection, and warms the engine up.
    q0 = queries[0]
    Searcher(store, name, encoder, schema).search(
        data.queries[q0.id], mode="dense", limit=1, embedding=QueryEmbedding(q0.dense, q0.sparse, q0.colbert)
    )
    result = CollectionResult(
        collection=name,
        chunks=store.count(name),
        colbert_dtype=schema.colbert_dtype,
        colbert_pooling=stored_pooling(store, name),
        disk_bytes=store.disk_bytes(name),
    )
    s = opts.settings
    for mode in modes:
        run: dict[str, dict[str, float]] = {}
        latency: list[float] = []
        for q in queries:
            t0 = time.perf_counter()
            if mode == CROSS_MODE:
                scores = cross_scores(
                    store, name, schema, q, data.queries[q.id], opts.reranker, opts.rerank_candidates, s
                )
            else:
                scores = search_mode(store, name, schema, mode, q, s)
            latency.append((time.perf_counter() - t0) * 1000)
            if opts.ignore_identical_ids:
                scores.pop(q.id, None)
            if scores:
                run[q.id] = dict(trec_order(scores)[: s.depth])
            bar.update(1)
        result.modes[mode] = ModeResult(mode, per_query(data.qrels, run), latency, run)
    return result


def _write_runs(root: Path, report: EvalReport) -> list[str]:
    """DIR/<mode>.trec (DIR/<collection>/<mode>.trec when several collections); the paths written."""
    several = len(report.collections) > 1
    written = []
    for c in report.collections:
        for mode, r in c.modes.items():
            path = (root / c.collection if several else root) / f"{mode}.trec"
            written.append(str(write_run(path, r.run, mode)))
    return written


__all__ = [
    "DEFAULT_WEIGHTS",
    "EVAL_MODES",
    "BeirDataset",
    "CollectionResult",
    "EvalOptions",
    "EvalReport",
    "ModeSettings",
    "check_corpus",
    "check_modes",
    "evaluate",
    "load_beir",
]
