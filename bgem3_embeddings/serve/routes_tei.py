"""text-embeddings-inference's API: `POST /embed` (dense), `POST /embed_sparse` (lexical weights),
`POST /tokenize`, `GET /info`, and the root route, with TEI's request fields and response shapes.

`/embed` answers `[[float, ...], ...]`; `/embed_sparse` answers `[[{"index": token_id, "value": weight},
...], ...]`, indices sorted and unique (the reference's lexical weights: the dot product of two is its
lexical matching score). As in TEI, `truncate` defaults to false: a text longer than the model's
max_input_length is refused with 413 unless `truncate: true`. `POST /` is `/embed`, as TEI routes its root
for an embedding model: huggingface_hub's `InferenceClient(base_url=...).feature_extraction(...)` (and
LangChain's `HuggingFaceEndpointEmbeddings` on it) posts there. `/tokenize` answers, per text, TEI's
`[{"id", "text", "special", "start", "stop"}]`, the ids `/embed_sparse`'s indices are. As in TEI's
`into_tokens` (core/src/tokenization.rs), `start` / `stop` are UTF-8 byte offsets (`text` is
`inputs.encode()[start:stop]` decoded), and only the <s> / </s> the tokenizer added are special, without
a span; a literal "</s>" or an <unk> in the text is a token of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from bgem3_embeddings._version import __version__
from bgem3_embeddings.json_pieces import list_json
from bgem3_embeddings.outputs import sparse_arrays
from bgem3_embeddings.serve.errors import ApiError
from bgem3_embeddings.serve.rerank_service import RerankService
from bgem3_embeddings.serve.schemas import TEIEmbedRequest, TEITokenizeRequest
from bgem3_embeddings.serve.service import EmbeddingService, embedding_service, off_loop
from bgem3_embeddings.serve.settings import ServeSettings
from bgem3_embeddings.serve.wire import truncation_headers
from bgem3_embeddings.tokenizer import TokenSpan

router = APIRouter()


def _service(request: Request) -> EmbeddingService:
    return embedding_service(request)


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
    note = encoded.cut_note(service.max_positions)
    return JSONResponse(encoded.result["dense_vecs"].tolist(), headers=truncation_headers(note))


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
    return JSONResponse(out, headers=truncation_headers(encoded.cut_note(service.max_positions)))


def utf8_offsets(text: str) -> list[int]:
    """Code point index -> UTF-8 byte offset, for 0..len(text) (one more entry than characters)."""
    if text.isascii():
        return list(range(len(text) + 1))
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    sizes = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    return [0, *np.cumsum(sizes).tolist()]


def tei_tokens(texts: Sequence[str], spans: Sequence[Sequence[TokenSpan]], add_special_tokens: bool) -> str:
    """TEI's /tokenize answer as JSON text: per text, its tokens with UTF-8 byte spans."""
    rows: list[str] = []
    for text, tokens in zip(texts, spans, strict=True):
        to_byte = utf8_offsets(text)
        row: list[dict[str, Any]] = []
        for t in tokens:
            if t.special:  # <s> / </s> the tokenizer added (TEI: special_tokens_mask): no span
                if add_special_tokens:
                    row.append({"id": t.id, "text": t.piece, "special": True, "start": None, "stop": None})
                continue
            start, stop = to_byte[t.start], to_byte[t.stop]
            row.append({"id": t.id, "text": text[t.start : t.stop], "special": False, "start": start,
                        "stop": stop})
        rows.append(list_json(row))  # in pieces: a 16 MB request must not hold the GIL for one dumps call
    return "[" + ",".join(rows) + "]"


@router.post("/tokenize")
async def tokenize(body: TEITokenizeRequest, request: Request) -> Response:
    """TEI's /tokenize: every token's id, its text and its UTF-8 byte span (added <s> / </s>: no span)."""
    _no_prompt(body.prompt_name)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    spans = await _service(request).token_spans(texts)
    content = await off_loop(sum(map(len, texts)), tei_tokens, texts, spans, body.add_special_tokens)
    return Response(content, media_type="application/json")


@router.get("/info")
async def info(request: Request) -> JSONResponse:
    """TEI's /info of the embedding model; with a reranker only, TEI's /info of a reranker. Beside the
    embedding model, the reranker is described under `reranker` (TEI serves one model per server)."""
    service: EmbeddingService | None = request.app.state.service
    rerank: RerankService | None = request.app.state.rerank
    settings: ServeSettings = request.app.state.settings
    common = {
        "model_sha": None,
        "max_concurrent_requests": settings.max_queued_texts,
        "max_batch_tokens": settings.cycle_tokens,
        "max_batch_requests": None,
        "max_client_batch_size": settings.max_inputs_per_request,
        "auto_truncate": False,
        "tokenization_workers": 1,
        "version": __version__,
    }
    reranker = None
    if rerank is not None:
        reranker = {
            "model_id": rerank.model_name,
            "model_dtype": getattr(rerank.reranker, "precision", None),
            "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
            "max_input_length": rerank.max_length,
        }
    if service is None:
        assert reranker is not None
        return JSONResponse({**reranker, **common})
    body = {
        "model_id": service.model_name,
        "model_dtype": getattr(service.encoder, "precision", None),
        "model_type": {"embedding": {"pooling": "cls"}},
        "max_input_length": service.max_positions,
        **common,
    }
    if reranker is not None:
        body["reranker"] = reranker
    return JSONResponse(body)
