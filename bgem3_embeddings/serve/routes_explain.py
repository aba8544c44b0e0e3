"""`POST /v1/bgem3/explain`: why passages score what they score for a query, per mode and per token.

    POST /v1/bgem3/explain {"query": "What is BGE M3?", "passage": "BGE M3 is an embedding model ..."}
    -> {"object": "list", "model": "...", "data": [<explanation>], "usage": {...}}

`passages: [...]` explains several passages in one call (one item each, in order). Each item is
`Explanation.to_dict()` (bgem3_embeddings/explain/result.py): dense score; sparse score and terms (token id,
token, weights, product, share, spans); ColBERT score and each query token's best passage token
(`colbert_matrix: true` adds the similarity matrix); the weighted `all` score and its parts. The query and
its passages go to the encoder together, in one batch, as `BGEM3Encoder.explain` encodes them.
"""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from bgem3_embeddings.explain.decompose import explain_outputs, prepare
from bgem3_embeddings.explain.result import check_weights
from bgem3_embeddings.serve.errors import ApiError
from bgem3_embeddings.serve.schemas import ExplainRequest
from bgem3_embeddings.serve.service import ALL_OUTPUTS, EmbeddingService

router = APIRouter()


@router.post("/v1/bgem3/explain")
async def explain(body: ExplainRequest, request: Request) -> JSONResponse:
    service: EmbeddingService = request.app.state.service
    if (body.passage is None) == (body.passages is None):
        raise ApiError(422, "give one of `passage` (a text) or `passages` (a list of texts)", param="passage")
    passages = [body.passage] if body.passage is not None else list(body.passages or [])
    field = "passage" if body.passage is not None else "passages"
    try:
        weights = check_weights(body.weights_for_different_modes)
    except ValueError as err:
        raise ApiError(422, str(err), param="weights_for_different_modes") from err
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
    except ValueError as err:  # an empty query or passage, named
        raise ApiError(422, str(err), param="query" if str(err).startswith("query") else field) from err
    encoded = await service.encode_token_ids(
        [query.ids] + [p.ids for p in explained], ALL_OUTPUTS, receive=request.receive
    )
    explanations = explain_outputs(query, explained, encoded.result, weights, body.colbert_matrix)
    return JSONResponse(
        {
            "object": "list",
            "model": service.model_name,
            "data": [{"index": i, **e.to_dict()} for i, e in enumerate(explanations)],
            "usage": encoded.usage(),
        }
    )
