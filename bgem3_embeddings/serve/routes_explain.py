"""`POST /v1/bgem3/explain`: why passages score what they score for a query, per mode and per token.

    POST /v1/bgem3/explain {"query": "What is BGE M3?", "passage": "BGE M3 is an embedding model ..."}
    -> {"object": "list", "model": "...", "data": [<explanation>], "usage": {...}}

`passages: [...]` explains several passages in one call (one item each, in order). Each item is
`Explanation.to_dict()` (bgem3_embeddings/explain/result.py): dense score; sparse score and terms (token id,
token, weights, product, share, spans); ColBERT score and each query token's best passage token
(`colbert_matrix: true` adds the similarity matrix, up to `max_colbert_matrix_cells` cells: 413 beyond); the
weighted `all` score and its parts. The query and its passages go to the encoder together, in one batch, as
`BGEM3Encoder.explain` encodes them. Tokenizing, taking the scores apart and writing the JSON answer (an
8192 x 8192 matrix is 1.3 GB of it) run in a worker thread, the JSON in pieces (json_pieces), so the event
loop keeps answering other clients meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
from fastapi import APIRouter, Request
from starlette.responses import Response

from bgem3_embeddings.explain.decompose import colbert_vectors, explain_outputs, matrix_cells, prepare
from bgem3_embeddings.explain.result import ExplainedText, check_weights
from bgem3_embeddings.json_pieces import dumps_with, matrix_json, placeholder
from bgem3_embeddings.query_text import check_query
from bgem3_embeddings.serve.errors import ApiError
from bgem3_embeddings.serve.schemas import ExplainRequest
from bgem3_embeddings.serve.service import ALL_OUTPUTS, Encoded, embedding_service

router = APIRouter()


def check_matrix_cells(query: ExplainedText, passages: Sequence[ExplainedText], limit: int) -> None:
    """413 naming max_colbert_matrix_cells when the matrices asked for hold more cells than `limit`."""
    cells = matrix_cells(query, passages)
    if cells > limit:
        rows, columns = colbert_vectors(query), sum(colbert_vectors(p) for p in passages)
        raise ApiError(
            413,
            f"the ColBERT matrix would have {cells} cells ({rows} query x {columns} passage tokens), more "
            f"than max_colbert_matrix_cells ({limit}): ask without colbert_matrix, or for shorter texts "
            "(max_query_length, max_passage_length)",
            param="max_colbert_matrix_cells",
        )


def answer_json(
    model: str,
    query: ExplainedText,
    passages: Sequence[ExplainedText],
    encoded: Encoded,
    weights: tuple[float, float, float],
    with_matrix: bool,
) -> bytes:
    """The explanations and the answer's JSON (for a worker thread): each item, and each matrix row by
    row, written by its own calls, so the GIL changes hands between them."""
    explanations = explain_outputs(query, passages, encoded.result, weights, with_matrix)
    items: dict[str, str] = {}
    for i, e in enumerate(explanations):
        item: dict[str, Any] = {"index": i, **e.to_dict(with_matrix=False)}
        matrix: dict[str, str] = {}
        if e.colbert_matrix is not None:
            mark = placeholder()
            item["colbert"]["matrix"] = mark
            matrix[mark] = matrix_json(e.colbert_matrix)
        items[placeholder()] = dumps_with(item, matrix)
    body = {"object": "list", "model": model, "data": list(items), "usage": encoded.usage()}
    return dumps_with(body, items).encode("utf-8")


@router.post("/v1/bgem3/explain")
async def explain(body: ExplainRequest, request: Request) -> Response:
    service = embedding_service(request)
    if (body.passage is None) == (body.passages is None):
        raise ApiError(422, "give one of `passage` (a text) or `passages` (a list of texts)", param="passage")
    passages = [body.passage] if body.passage is not None else list(body.passages or [])
    field = "passage" if body.passage is not None else "passages"
    try:
        weights = check_weights(body.weights_for_different_modes)
    except ValueError as err:
        raise ApiError(422, str(err), param="weights_for_different_modes") from err
    try:
        check_query(body.query)  # the rule every query follows (query_text.py)
    except ValueError as err:  # empty: 400, as every empty text a user sends (service.check_texts)
        raise ApiError(400, str(err), param="query", tei_type="Empty") from err
    service.check_texts([body.query], "query")
    service.check_texts(passages, field)
    service.check_outputs(ALL_OUTPUTS)  # explain needs all three heads
    enc = service.encoder
    try:
        # Tokenized with character spans off the event loop: a long passage must not hold up other requests.
        query, explained = await anyio.to_thread.run_sync(
            prepare,
            enc.tokenizer,
            body.query,
            passages,
            service.max_length(body.max_query_length, int(enc.query_max_length)),
            service.max_length(body.max_passage_length, int(enc.passage_max_length)),
        )
    except ValueError as err:  # an empty passage, named (the query was checked above)
        raise ApiError(422, str(err), param=field) from err
    if body.colbert_matrix:  # refused before the encoder runs
        check_matrix_cells(query, explained, service.settings.max_colbert_matrix_cells)
    encoded = await service.encode_token_ids(
        [query.ids] + [p.ids for p in explained], ALL_OUTPUTS, receive=request.receive
    )
    content = await anyio.to_thread.run_sync(
        answer_json, service.model_name, query, explained, encoded, weights, body.colbert_matrix
    )
    return Response(content, media_type="application/json")
