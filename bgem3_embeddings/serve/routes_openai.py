"""OpenAI's embeddings API (`POST /v1/embeddings`, `GET /v1/models`): dense vectors for the stock `openai`
client and LangChain's `OpenAIEmbeddings(base_url=...)`.

Wire format as OpenAI documents it: `input` a string or a list of strings, `encoding_format` "float"
(lists) or "base64" (little-endian float32, what the `openai` Python client asks for by default);
`usage` counts the model's real tokens (<s> and </s> included).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from bgem3_embeddings.serve.errors import ApiError
from bgem3_embeddings.serve.schemas import OpenAIEmbeddingRequest
from bgem3_embeddings.serve.service import EmbeddingService, embedding_service
from bgem3_embeddings.serve.wire import dense_item, truncation_headers

router = APIRouter()
STARTED = int(time.time())


def _service(request: Request) -> EmbeddingService:
    return embedding_service(request)


@router.post("/v1/embeddings")
async def embeddings(body: OpenAIEmbeddingRequest, request: Request) -> JSONResponse:
    service = _service(request)
    if body.dimensions is not None and body.dimensions != service.encoder.hidden_size:
        raise ApiError(
            422,
            f"dimensions {body.dimensions} is not available: BGE-M3 vectors have "
            f"{service.encoder.hidden_size} dimensions (leave `dimensions` out)",
            param="dimensions",
        )
    texts = [body.input] if isinstance(body.input, str) else body.input
    max_length = service.max_length(None, int(service.encoder.passage_max_length))
    encoded = await service.encode(texts, (True, False, False), max_length, receive=request.receive)
    dense = encoded.result["dense_vecs"]
    data = [
        {"object": "embedding", "index": i, "embedding": dense_item(dense[i], body.encoding_format)}
        for i in range(len(texts))
    ]
    return JSONResponse(
        {"object": "list", "data": data, "model": service.model_name, "usage": encoded.usage()},
        headers=truncation_headers(encoded.cut_note(max_length)),
    )


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    service = _service(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": service.model_name,
                    "object": "model",
                    "created": STARTED,
                    "owned_by": "bgem3-embeddings",
                }
            ],
        }
    )
