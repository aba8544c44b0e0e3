"""text-embeddings-inference's API: `POST /embed` (dense), `POST /embed_sparse` (lexical weights),
`POST /tokenize`, `GET /info`, and the root route, with TEI's request fields and response shapes.

`/embed` answers `[[float, ...], ...]`; `/embed_sparse` answers `[[{"index": token_id, "value": weight},
...], ...]`, indices sorted and unique (the reference's lexical weights: the dot product of two is its
lexical matching score). As in TEI, `truncate` defaults to false: a text longer than the model's
max_input_length is refused with 413 unless `truncate: true`. `POST /` is `/embed`, as TEI routes its root
for an embedding model: huggingface_hub's `InferenceClient(base_url=...).feature_extraction(...)` (and
LangChain's `HuggingFaceEndpointEmbeddings` on it) posts there. `/tokenize` answers, per text, TEI's
`[{"id", "text", "special", "start", "stop"}]` (character offsets; special tokens have no span), the ids
`/embed_sparse`'s indices are.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from bgem3_embeddings._version import __version__
from bgem3_embeddings.outputs import sparse_arrays
from bgem3_embeddings.serve.errors import ApiError
from bgem3_embeddings.serve.schemas import TEIEmbedRequest, TEITokenizeRequest
from bgem3_embeddings.serve.service import EmbeddingService

router = APIRouter()


def _service(request: Request) -> EmbeddingService:
    service: EmbeddingService = request.app.state.service
    return service


def _no_prompt(prompt_name: str | None) -> None:
    if prompt_name is not None:
        raise ApiError(422, "prompt_name is not supported: BGE-M3 uses no prompts", param="prompt_name")


def _check(body: TEIEmbedRequest, service: EmbeddingService) -> list[str]:
    _no_prompt(body.prompt_name)
    if body.dimensions is not None and body.dimensions != service.encoder.hidden_size:
        raise ApiError(
            422,
            f"dimensions {body.dimensions} is not available: BGE-M3 vectors have "
            f"{service.encoder.hidden_size} dimensions",
            param="dimensions",
        )
    return [body.inputs] if isinstance(body.inputs, str) else body.inputs


@router.post("/")  # TEI's root route for an embedding model (huggingface_hub's InferenceClient)
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


@router.post("/tokenize")
async def tokenize(body: TEITokenizeRequest, request: Request) -> JSONResponse:
    """TEI's /tokenize: every token's id, its text and its character span (special tokens: no span)."""
    _no_prompt(body.prompt_name)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    out = []
    for text, tokens in zip(texts, await _service(request).token_spans(texts), strict=True):
        row = []
        for t in tokens:
            # <s> / </s> the tokenizer added around the text have no span; a literal "</s>" in the text
            # (or an <unk>) keeps its characters, as TEI reports them.
            added = t.special and t.start == t.stop
            if added and not body.add_special_tokens:
                continue
            if added:
                row.append({"id": t.id, "text": t.piece, "special": True, "start": None, "stop": None})
            else:
                piece = text[t.start : t.stop]
                row.append({"id": t.id, "text": piece, "special": False, "start": t.start, "stop": t.stop})
        out.append(row)
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
