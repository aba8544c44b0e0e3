"""text-embeddings-inference's API: `POST /embed` (dense), `POST /embed_sparse` (lexical weights),
`GET /info`, with TEI's request fields and response shapes.

`/embed` answers `[[float, ...], ...]`; `/embed_sparse` answers `[[{"index": token_id, "value": weight},
...], ...]`, indices sorted and unique (the reference's lexical weights: the dot product of two is its
lexical matching score). As in TEI, `truncate` defaults to false: a text longer than the model's
max_input_length is refused with 413 unless `truncate: true`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from bgem3_embeddings._version import __version__
from bgem3_embeddings.outputs import sparse_arrays
from bgem3_embeddings.serve.errors import ApiError
from bgem3_embeddings.serve.schemas import TEIEmbedRequest
from bgem3_embeddings.serve.service import EmbeddingService

router = APIRouter()


def _service(request: Request) -> EmbeddingService:
    service: EmbeddingService = request.app.state.service
    return service


def _check(body: TEIEmbedRequest, service: EmbeddingService) -> list[str]:
    if body.prompt_name is not None:
        raise ApiError(422, "prompt_name is not supported: BGE-M3 uses no prompts", param="prompt_name")
    if body.dimensions is not None and body.dimensions != service.encoder.hidden_size:
        raise ApiError(
            422,
            f"dimensions {body.dimensions} is not available: BGE-M3 vectors have "
            f"{service.encoder.hidden_size} dimensions",
            param="dimensions",
        )
    return [body.inputs] if isinstance(body.inputs, str) else body.inputs


@router.post("/embed")
async def embed(body: TEIEmbedRequest, request: Request) -> JSONResponse:
    service = _service(request)
    texts = _check(body, service)
    if not body.normalize:
        raise ApiError(
            422,
            "normalize=false is not supported: BGE-M3's dense vectors are L2-normalised",
            param="normalize",
        )
    encoded = await service.encode(
        texts,
        (True, False, False),
        service.max_positions,
        receive=request.receive,
        truncate=body.truncate,
        field="inputs",
    )
    return JSONResponse(encoded.result["dense_vecs"].tolist())


@router.post("/embed_sparse")
async def embed_sparse(body: TEIEmbedRequest, request: Request) -> JSONResponse:
    service = _service(request)
    texts = _check(body, service)
    encoded = await service.encode(
        texts,
        (False, True, False),
        service.max_positions,
        receive=request.receive,
        truncate=body.truncate,
        field="inputs",
    )
    out = []
    for weights in encoded.result["lexical_weights"]:
        indices, values = sparse_arrays(weights)
        out.append(
            [{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
        )
    return JSONResponse(out)


@router.get("/info")
async def info(request: Request) -> JSONResponse:
    service = _service(request)
    settings = service.settings
    return JSONResponse(
        {
            "model_id": service.model_name,
            "model_sha": None,
            "model_dtype": getattr(service.encoder, "precision", None),
            "model_type": {"embedding": {"pooling": "cls"}},
            "max_concurrent_requests": settings.max_queued_texts,
            "max_input_length": service.max_positions,
            "max_batch_tokens": settings.cycle_tokens,
            "max_batch_requests": None,
            "max_client_batch_size": settings.max_inputs_per_request,
            "auto_truncate": False,
            "tokenization_workers": 1,
            "version": __version__,
        }
    )
