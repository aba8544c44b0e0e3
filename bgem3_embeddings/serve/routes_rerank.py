"""The cross-encoder's routes (`bgem3 serve --reranker MODEL`): text-embeddings-inference's `POST /rerank` and
the Cohere-style `POST /v1/rerank` and `POST /v2/rerank`.

    POST /rerank {"query": "What is BGE M3?", "texts": ["BGE M3 is ...", "BM25 is ..."]}
    -> [{"index": 0, "score": 0.98}, {"index": 1, "score": 0.01}]            (best first; TEI's bare array)

    POST /v2/rerank {"model": "...", "query": "...", "documents": ["...", "..."], "top_n": 1}
    -> {"id": "...", "model": "...", "results": [{"index": 0, "relevance_score": 0.98}], "usage": {...}}

TEI's scores go through a sigmoid unless `raw_scores: true` (then the logit, FlagReranker's score);
`return_text: true` adds each text. Its `truncate` defaults to false: a pair longer than the reranker's
max_input_length is refused (413). The Cohere-style routes always truncate (as Cohere does), score with the
sigmoid (Cohere's relevance scores lie in [0, 1]), take documents as strings or `{"text": ...}`, return the
first `top_n` and, with `return_documents: true`, each document as `{"text": ...}`.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from bgem3_embeddings.serve.errors import ApiError
from bgem3_embeddings.serve.rerank_service import RerankService
from bgem3_embeddings.serve.schemas import CohereRerankRequest, TEIRerankRequest

router = APIRouter()


def rerank_service(request: Request) -> RerankService:
    """The reranker's service; 404 naming the option when the server was started without one."""
    service: RerankService | None = request.app.state.rerank
    if service is None:
        raise ApiError(
            404,
            f"this server has no reranker ({request.url.path} needs one): start `bgem3 serve` with "
            "--reranker BAAI/bge-reranker-v2-m3 (beside --model, or alone)",
            param="reranker",
        )
    return service


@router.post("/rerank")
async def tei_rerank(body: TEIRerankRequest, request: Request) -> JSONResponse:
    service = rerank_service(request)
    scored = await service.score(
        body.query, body.texts, truncate=body.truncate, field="texts", receive=request.receive
    )
    out = []
    for index, score in scored.ranked(normalize=not body.raw_scores):
        item: dict[str, object] = {"index": index, "score": score}
        if body.return_text:
            item["text"] = body.texts[index]
        out.append(item)
    return JSONResponse(out)


@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def cohere_rerank(body: CohereRerankRequest, request: Request) -> JSONResponse:
    service = rerank_service(request)
    if body.max_tokens_per_doc is not None:
        raise ApiError(
            422,
            "max_tokens_per_doc is not supported: each (query, document) pair is cut at the reranker's "
            f"max_input_length ({service.max_length} tokens), as FlagReranker cuts it; leave it out",
            param="max_tokens_per_doc",
        )
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    scored = await service.score(body.query, texts, truncate=True, field="documents", receive=request.receive)
    results = []
    for index, score in scored.ranked(normalize=True, top_n=body.top_n):
        item: dict[str, object] = {"index": index, "relevance_score": score}
        if body.return_documents:
            item["document"] = {"text": texts[index]}
        results.append(item)
    total = sum(scored.tokens)
    return JSONResponse(
        {
            "id": str(uuid.uuid4()),
            "model": service.model_name,
            "results": results,
            "usage": {"prompt_tokens": total, "total_tokens": total},
            "meta": {"billed_units": {"search_units": 1}},
        }
    )
