"""Operations: `GET /health` (200 once the model is loaded and warm, 503 while starting or stopping; also
`GET /`, as text-embeddings-inference answers it) and `GET /metrics` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from bgem3_embeddings.serve.metrics import ServeMetrics
from bgem3_embeddings.serve.service import EmbeddingService

router = APIRouter()


@router.get("/")
@router.get("/health")
async def health(request: Request) -> JSONResponse:
    service: EmbeddingService = request.app.state.service
    if service.ready and service.batcher.running:
        return JSONResponse({"status": "ok", "model": service.model_name})
    state = "starting" if not service.ready else "stopping"
    return JSONResponse({"status": state}, status_code=503, headers={"Retry-After": "1"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry: ServeMetrics = request.app.state.metrics
    return Response(registry.render(), media_type=CONTENT_TYPE_LATEST)
