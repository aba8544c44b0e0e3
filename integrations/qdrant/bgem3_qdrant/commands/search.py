"""`bgem3-qdrant search`: query a collection and print its hits (with --explain: why each ranked)."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from bgem3_embeddings.cli_support import check_inputs
from bgem3_embeddings.explain.cli import DEFAULT_WEIGHTS, parse_weights
from bgem3_embeddings.query_text import check_query, query_cut_note

from ..schema import check_choice
from ..stores.base import MODES
from .common import (
    CollectionOpt,
    DeviceOpt,
    EncoderKeyOpt,
    EncoderUrlOpt,
    EngineOpt,
    KeyOpt,
    PathOpt,
    PrecisionOpt,
    ReadModelOpt,
    RerankCandidatesOpt,
    RerankerOpt,
    UrlOpt,
    VerboseOpt,
    collection_model,
    fail,
    load_reranker_option,
    setup_logging,
    store_target,
)

if TYPE_CHECKING:
    from ..stores.base import Mode


def score_legend(mode: str, hits: list[Any], sparse_modifier: str = "none") -> list[str]:
    """What the bracketed [score] of `mode`'s hits is, beside their per-stage scores (lines of <= 80)."""
    if mode == "rerank":
        first = hits[0] if hits else None
        colbert = first.scores.get("colbert") if first is not None else None
        # colbert= is the MaxSim sum over the query's vectors divided by their count (FlagEmbedding's mean)
        count = round(first.score / colbert) if first is not None and colbert else None
        return [
            f"[score]: Qdrant's rerank, ColBERT MaxSim summed over the query's "
            f"{f'{count} ' if count else ''}vectors",
            f"colbert=: FlagEmbedding's ColBERT score, their mean ([score] / {count or 'their count'})",
        ]
    if mode == "hybrid":
        return ["[score]: reciprocal rank fusion of the dense and sparse ranks (rrf=)"]
    if mode == "sparse" and sparse_modifier == "idf":
        return [
            "[score]: Qdrant's sparse dot product, IDF-weighted (the collection's modifier)",
            "sparse=: FlagEmbedding's lexical score, without IDF",
        ]
    if mode == "sparse":
        return ["[score]: Qdrant's sparse dot product (= sparse=, FlagEmbedding's lexical score)"]
    return ["[score]: Qdrant's dense cosine (= dense=)"]


def cross_encoder_legend(mode: str, reranker: str, limit: int, rerank_candidates: int | None) -> str:
    """Which stage ordered the hits when a cross-encoder did, and what the other scores are."""
    from ..cross_encoder import MODE_STAGE, candidates_for

    count = candidates_for(limit, rerank_candidates)
    return textwrap.fill(
        f"[score]: the cross-encoder {reranker} (cross_encoder=, its logit: higher is more relevant) "
        f"ordered the top {count} hits of --mode {mode}; the other scores are that mode's "
        f"({MODE_STAGE.get(mode, mode)}= ordered them before)",
        80,
    )


def explain_notes(colbert_pooling: int, sparse_modifier: str) -> list[str]:
    """Where a hit's search scores and its explanation (the text encoded again) differ, and why."""
    notes = []
    if colbert_pooling > 1:
        notes.append(
            f"note: the collection stores ColBERT rows pooled by {colbert_pooling}: colbert= and the rerank "
            "score come from the pooled rows, the explanation's colbert from every token of the text"
        )
    if sparse_modifier == "idf":
        notes.append(
            "note: the collection's sparse index weights terms by IDF: the sparse stage ranked with IDF; "
            "sparse= and the explanation's sparse score are FlagEmbedding's, without IDF"
        )
    return notes


def search(
    queries: Annotated[list[str], typer.Argument(help="Query text (several queries: searched in turn).")],
    collection: CollectionOpt = "documents",
    mode: Annotated[
        str,
        typer.Option(
            help="dense | sparse | hybrid (dense + sparse, fused by RRF) | rerank (the default: hybrid's "
            "candidates ordered by ColBERT). `bgem3-qdrant eval` also has colbert and all, to compare with "
            "the BGE-M3 paper; they are not search modes."
        ),
    ] = "rerank",
    limit: Annotated[int, typer.Option("--limit", "-k", min=1, help="Number of hits.")] = 5,
    prefetch_limit: Annotated[int | None, typer.Option(help="Candidates per index (hybrid/rerank).")] = None,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter", "-f", help="Payload filter key=value (repeatable; metadata keys as is, e.g. lang=fr)."
        ),
    ] = None,
    model: ReadModelOpt = None,
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    reranker: RerankerOpt = None,
    rerank_candidates: RerankCandidatesOpt = None,
    width: Annotated[int, typer.Option(help="Characters of text shown per hit.")] = 160,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Under each hit: its score per mode, top sparse terms and ColBERT alignments "
            "(with --json: an `explanation` object per hit).",
        ),
    ] = False,
    weights: Annotated[
        str, typer.Option(help="With --explain: weights of dense,sparse,colbert in the combined score.")
    ] = DEFAULT_WEIGHTS,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help='One JSON line per query: {"query", "mode", "hits": [...]} ("hits": [] for none; with '
            '--reranker also "ordered_by" and "reranker").',
        ),
    ] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Search a collection; prints hits with their per-stage scores (--explain: why each hit ranked)."""
    setup_logging(verbose)
    from ..cross_encoder import search_with_cross_encoder
    from ..encoder import connect_encoder, load_encoder
    from ..filters import parse_filter_args
    from ..identity import stored_pooling
    from ..search import Searcher, hit_record
    from ..stores.open import open_store

    mode_weights = parse_weights(weights)
    try:
        check_search_mode(mode)
        for i, query in enumerate(queries):
            try:
                check_query(query)
            except ValueError as e:  # which one, when several are searched
                raise ValueError(f"QUERY {i + 1}: {e}" if len(queries) > 1 else str(e)) from e
        flt = parse_filter_args(filters or [])
    except ValueError as e:
        raise fail(e) from e
    store = open_store(store_target(path, url, api_key, store_engine))
    try:
        if not store.collection_exists(collection):
            raise fail(store.missing(collection))
        if encoder_url:
            encoder = connect_encoder(encoder_url, encoder_api_key)
        else:
            model = collection_model(store, collection, model)
            check_inputs(model)  # its files, before the model loads
            encoder = load_encoder(model, precision=precision, device=device)
        cross_encoder = load_reranker_option(reranker, precision, device)
        searcher = Searcher(store, collection, encoder)
        sparse_modifier = store.stored_schema(collection).sparse_modifier
        notes = explain_notes(stored_pooling(store, collection), sparse_modifier) if explain else []
        for i, query in enumerate(queries):  # said once per query (--explain's hits do not repeat it)
            cut = query_cut_note(encoder, query)
            if cut:
                typer.echo(f"warning: {f'QUERY {i + 1}: ' if len(queries) > 1 else ''}{cut}", err=True)
        for key in searcher.missing_filter_keys(flt):
            typer.echo(
                f"warning: no point of {collection!r} has the filter key {key!r} (--filter); "
                "the search runs but cannot match it",
                err=True,
            )
        results = [
            (
                query,
                search_with_cross_encoder(
                    searcher,
                    query,
                    cross_encoder,
                    limit=limit,
                    rerank_candidates=rerank_candidates,
                    mode=cast("Mode", mode),
                    prefetch_limit=prefetch_limit,
                    filter=flt or None,
                ),
            )
            for query in queries
        ]
        # One encode per query: the query and its hits' texts together (explain_many).
        explained = [
            encoder.explain_many(query, [h.text for h in hits], weights=mode_weights)
            if explain and hits
            else []
            for query, hits in results
        ]
    finally:
        store.close()
    for note in notes if json_out else []:  # stdout holds JSON lines only
        typer.echo(note, err=True)
    for (query, hits), explanations in zip(results, explained, strict=True):
        if json_out:  # the same object with no hits: "hits": [] (a script tells "none" from a failure)
            records = [hit_record(query, h, e) for h, e in itertools.zip_longest(hits, explanations)]
            line: dict[str, Any] = {"query": query, "mode": mode, "hits": records}
            if cross_encoder is not None:
                line.update(ordered_by="cross_encoder", reranker=reranker)
            typer.echo(json.dumps(line, ensure_ascii=False))
            continue
        if len(results) > 1:
            typer.echo(f"\n== {query}")
        print_hits(hits, width, explanations)
        if cross_encoder is not None and hits:
            typer.echo(cross_encoder_legend(mode, reranker or "", limit, rerank_candidates))
            continue
        for legend in score_legend(mode, hits, sparse_modifier) if hits else []:
            typer.echo(legend)
    for note in notes if not json_out and any(hits for _, hits in results) else []:
        typer.echo(textwrap.fill(note, 80, subsequent_indent="  "))


def check_search_mode(mode: str) -> None:
    """ValueError unless `mode` is a search mode; eval's own modes are refused with why they are eval's."""
    from ..evaluation.modes import EVAL_ONLY_MODES

    if mode in EVAL_ONLY_MODES:
        raise ValueError(
            f"--mode {mode} is a mode of `bgem3-qdrant eval --modes` only: {EVAL_ONLY_MODES[mode]}. "
            f"Search with one of {', '.join(MODES)} (rerank: ColBERT over dense + sparse candidates)"
        )
    check_choice("--mode", mode, MODES)


def print_hits(hits: list[Any], width: int, explanations: list[Any] | None = None) -> None:
    """Ranked hits: score, document, chunk, per-stage scores, then the text (and its explanation)."""
    from bgem3_embeddings.explain.render import render

    from ..search import EXPLAIN_TOP

    if not hits:
        typer.echo("no hits")
    for rank, (h, explanation) in enumerate(itertools.zip_longest(hits, explanations or []), start=1):
        stages = "  ".join(f"{k}={v:.4f}" for k, v in h.scores.items())
        where = h.doc_id if h.doc_id and h.doc_id != h.source else display(h.source)
        text = " ".join(h.text.split())
        text = text if len(text) <= width else text[: width - 1] + "…"
        typer.echo(f"{rank}. [{h.score:.4f}] {where} #{h.chunk_index}  ({stages})")
        typer.echo(f"   {text}")
        if explanation is not None:
            lines = render(explanation, EXPLAIN_TOP, EXPLAIN_TOP, indent="   ", query_note=False)
            for line in lines:
                typer.echo(line)


def display(path: str | None) -> str:
    """A source path relative to the working directory when it lies below it."""
    if not path:
        return "-"
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
