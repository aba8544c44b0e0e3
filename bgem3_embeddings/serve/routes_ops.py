"""Operations: `GET /health` (200 once the models are loaded and warm, 503 while starting or
stopping; also `GET /`, as text-embeddings-inference answers it; `reranker` names the reranker when one is
served) and `GET /metrics` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from bgem3_embeddings.serve.metrics import ServeMetrics
from bgem3_embeddings.serve.rerank_service import RerankService
from bgem3_embeddings.serve.service import EmbeddingService

router = APIRouter()


@router.get("/")
@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 when every model served (the embedding model, the reranker) is warm and its batcher runs."""
    service: EmbeddingService | None = request.app.state.service
    rerank: RerankService | None = request.app.state.rerank
    loaded = [s for s in (service, rerank) if s is not None]
    if all(s.ready and s.batcher.running for s in loaded):
        body = {"status": "ok", "model": loaded[0].model_name}
        if rerank is not None:
            body["reranker"] = rerank.model_name
        return JSONResponse(body)
    state = "starting" if not all(s.ready for s in loaded) else "stopping"
    return JSONResponse({"status": state}, status_code=503, headers={"Retry-After": "1"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry: ServeMetrics = request.app.state.metrics
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
