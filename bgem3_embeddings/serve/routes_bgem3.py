"""All three BGE-M3 outputs with FlagEmbedding's names: `POST /v1/bgem3/encode`, `POST /v1/bgem3/score`,
and what a client needs to act like a local encoder: `GET /v1/bgem3/info`, `GET /v1/bgem3/tokenizer`.

    POST /v1/bgem3/encode {"input": ["What is BGE M3?"], "return_sparse": true, "return_colbert_vecs": true}
    -> {"object": "list", "model": "...", "data": [{"index": 0, "dense_vecs": [...],
        "lexical_weights": {"<token id>": w, ...}, "colbert_vecs": [[...], ...]}], "usage": {...}}

Each item holds only the outputs asked for. `encoding_format: "base64"` writes dense and ColBERT as base64
of little-endian float32 (ColBERT row-major, with `colbert_shape`); adding `colbert_dtype: "float16"` is the
compact ColBERT form (half the bytes, float16 rounding).
"""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from bgem3_embeddings._version import __version__
from bgem3_embeddings.query_text import empty_text, is_blank
from bgem3_embeddings.scoring import (
    FLAGEMBEDDING_WEIGHTS,
    colbert_score,
    combine_scores,
    lexical_matching_score,
)
from bgem3_embeddings.serve.errors import ApiError, empty_input
from bgem3_embeddings.serve.rerank_service import RerankService
from bgem3_embeddings.serve.schemas import EncodeRequest, ScoreRequest
from bgem3_embeddings.serve.service import ALL_OUTPUTS, EmbeddingService, embedding_service
from bgem3_embeddings.serve.wire import colbert_item, dense_item, truncation_headers

router = APIRouter()


def _service(request: Request) -> EmbeddingService:
    return embedding_service(request)


@router.post("/v1/bgem3/encode")
async def encode(body: EncodeRequest, request: Request) -> JSONResponse:
    service = _service(request)
    if body.colbert_dtype == "float16" and body.encoding_format != "base64":
        raise ApiError(
            422, 'colbert_dtype "float16" needs encoding_format "base64"', param="colbert_dtype"
        )
    texts = [body.input] if isinstance(body.input, str) else body.input
    outputs = (body.return_dense, body.return_sparse, body.return_colbert_vecs)
    max_length = service.max_length(body.max_length, int(service.encoder.passage_max_length))
    encoded = await service.encode(texts, outputs, max_length, receive=request.receive)
    result = encoded.result
    data = []
    for i in range(len(texts)):
        item: dict[str, object] = {"index": i}
        if body.return_dense:
            item["dense_vecs"] = dense_item(result["dense_vecs"][i], body.encoding_format)
        if body.return_sparse:
            item["lexical_weights"] = result["lexical_weights"][i]
        if body.return_colbert_vecs:
            item.update(colbert_item(result["colbert_vecs"][i], body.encoding_format, body.colbert_dtype))
        data.append(item)
    note = encoded.cut_note(max_length)
    body_out: dict[str, object] = {
        "object": "list", "model": service.model_name, "data": data, "usage": encoded.usage()
    }
    if note:
        body_out["warnings"] = [note]
    return JSONResponse(body_out, headers=truncation_headers(note))


@router.post("/v1/bgem3/score")
async def score(body: ScoreRequest, request: Request) -> JSONResponse:
    """compute_score: dense, sparse, colbert and the two weighted sums per (query, passage) pair."""
    service = _service(request)
    pairs = body.sentence_pairs
    if not pairs:
        raise empty_input("sentence_pairs")
    weights = [float(w) for w in (body.weights_for_different_modes or FLAGEMBEDDING_WEIGHTS)]
    if sum(weights[:2]) == 0 or sum(weights) == 0:
        raise ApiError(
            422, f"weights_for_different_modes must not sum to zero, got {weights}",
            param="weights_for_different_modes",
        )
    for i, pair in enumerate(pairs):  # each text named where it is (check_texts would see one list)
        for j, text in enumerate(pair):
            if is_blank(text):
                raise ApiError(400, empty_text(f"`sentence_pairs[{i}][{j}]`"), param="sentence_pairs")
    service.check_texts([t for pair in pairs for t in pair], "sentence_pairs (flattened)")
    enc = service.encoder
    query_length = service.max_length(body.max_query_length, int(enc.query_max_length))
    passage_length = service.max_length(body.max_passage_length, int(enc.passage_max_length))
    q, p = await asyncio.gather(
        service.encode([pair[0] for pair in pairs], ALL_OUTPUTS, query_length, receive=request.receive),
        service.encode([pair[1] for pair in pairs], ALL_OUTPUTS, passage_length, receive=request.receive),
    )
    qr, pr = q.result, p.result
    dense = np.einsum("ij,ij->i", qr["dense_vecs"], pr["dense_vecs"]).tolist()
    sparse = [
        lexical_matching_score(a, b)
        for a, b in zip(qr["lexical_weights"], pr["lexical_weights"], strict=True)
    ]
    colbert = [colbert_score(a, b) for a, b in zip(qr["colbert_vecs"], pr["colbert_vecs"], strict=True)]
    total = sum(q.tokens) + sum(p.tokens)
    out: dict[str, object] = {
        "object": "bgem3.scores",
        "model": service.model_name,
        "scores": combine_scores(dense, sparse, colbert, weights),
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }
    # "text i" in a note is sentence_pairs[i - 1]'s query or passage, as its prefix says.
    notes = [
        f"{side}: {note}"
        for side, note in (
            ("queries", q.cut_note(query_length, "query")),
            ("passages", p.cut_note(passage_length, "passage")),
        )
        if note
    ]
    if notes:
        out["warnings"] = notes
    return JSONResponse(out, headers=truncation_headers(*notes))


@router.get("/v1/bgem3/info")
async def info(request: Request) -> JSONResponse:
    """The embedding model's description (`EmbeddingService.info`) and, under `reranker`, the reranker's
    (None when none is served); with a reranker only, `model` is None and `reranker` says what is loaded."""
    service: EmbeddingService | None = request.app.state.service
    rerank: RerankService | None = request.app.state.rerank
    if service is not None:
        body = service.info()
    else:
        assert rerank is not None  # create_app serves one model at least
        body = {"model": None, "limits": rerank.settings.limits(), "version": __version__}
    body["reranker"] = rerank.info() if rerank is not None else None
    return JSONResponse(body)


@router.get("/v1/bgem3/tokenizer")
async def tokenizer(request: Request) -> JSONResponse:
    return JSONResponse(_service(request).tokenizer_spec())
