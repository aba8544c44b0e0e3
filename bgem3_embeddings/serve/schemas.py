"""Request bodies of every endpoint (pydantic): a wrong type is answered 422 with the field's path.

Fields follow the API each endpoint copies: OpenAI's embeddings API, text-embeddings-inference's `/embed`
and `/embed_sparse`, and FlagEmbedding's `BGEM3FlagModel.encode` / `compute_score` argument names.
The OpenAI and TEI bodies ignore fields they do not know (their clients send a few more, e.g. `user`);
this project's own endpoints refuse them, so a misspelt `return_colbert_vecs` is not silently dropped.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS

Texts = StrictStr | list[StrictStr]


class OpenAIEmbeddingRequest(BaseModel):
    """POST /v1/embeddings. `model` is accepted whatever it says (one model is served)."""

    model_config = ConfigDict(extra="ignore")

    input: Texts
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None


class TEIEmbedRequest(BaseModel):
    """POST /embed and /embed_sparse. `truncate` false (TEI's default): a text past the model's length is
    refused (413) instead of cut."""

    model_config = ConfigDict(extra="ignore")

    inputs: Texts
    normalize: StrictBool = True
    truncate: StrictBool = False
    truncation_direction: Literal["Right", "right"] = "Right"
    prompt_name: StrictStr | None = None
    dimensions: StrictInt | None = None


class TEITokenizeRequest(BaseModel):
    """POST /tokenize: TEI's fields (`add_special_tokens` true: <s> and </s> are listed)."""

    model_config = ConfigDict(extra="ignore")

    inputs: Texts
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None


class EncodeRequest(BaseModel):
    """POST /v1/bgem3/encode: FlagEmbedding's `encode` arguments, and how to write the numbers."""

    model_config = ConfigDict(extra="forbid")

    input: Texts
    return_dense: StrictBool = True
    return_sparse: StrictBool = False
    return_colbert_vecs: StrictBool = False
    max_length: StrictInt | None = Field(default=None, ge=2)
    # "base64": dense and ColBERT as base64 of little-endian floats (exact, a third of the JSON size)
    encoding_format: Literal["float", "base64"] = "float"
    # "float16" (with base64): the compact ColBERT form, half the bytes again, float16 rounding
    colbert_dtype: Literal["float32", "float16"] = "float32"
    model: StrictStr | None = None


class ScoreRequest(BaseModel):
    """POST /v1/bgem3/score: FlagEmbedding's `compute_score(sentence_pairs, ...)`."""

    model_config = ConfigDict(extra="forbid")

    sentence_pairs: list[tuple[StrictStr, StrictStr]]
    weights_for_different_modes: list[StrictFloat | StrictInt] | None = Field(
        default=None, min_length=3, max_length=3
    )
    max_query_length: StrictInt | None = Field(default=None, ge=2)
    max_passage_length: StrictInt | None = Field(default=None, ge=2)
    model: StrictStr | None = None


class ExplainRequest(BaseModel):
    """POST /v1/bgem3/explain: one query against one `passage` or several `passages` (give one of them)."""

    model_config = ConfigDict(extra="forbid")

    query: StrictStr
    passage: StrictStr | None = None
    passages: list[StrictStr] | None = None
    # dense, sparse, colbert: compute_score's weights_for_different_modes (the model card's, by default)
    weights_for_different_modes: list[StrictFloat | StrictInt] = Field(
        default=list(DEFAULT_MODE_WEIGHTS), min_length=3, max_length=3
    )
    colbert_matrix: StrictBool = False
    max_query_length: StrictInt | None = Field(default=None, ge=2)
    max_passage_length: StrictInt | None = Field(default=None, ge=2)
    model: StrictStr | None = None


class TEIRerankRequest(BaseModel):
    """POST /rerank: text-embeddings-inference's fields. `raw_scores` false (TEI's default): scores through
    a sigmoid (FlagReranker's normalize=True); `truncate` false: a pair past the reranker's length is
    refused."""

    model_config = ConfigDict(extra="ignore")

    query: StrictStr
    texts: list[StrictStr]
    truncate: StrictBool = False
    truncation_direction: Literal["Right", "right"] = "Right"
    raw_scores: StrictBool = False
    return_text: StrictBool = False


class CohereDocument(BaseModel):
    """A document as an object (Cohere's v1 API): only its `text` is read."""

    model_config = ConfigDict(extra="ignore")

    text: StrictStr


class CohereRerankRequest(BaseModel):
    """POST /v1/rerank and /v2/rerank (Cohere's API, as infinity and vLLM serve it). `model` is accepted
    whatever it says (one reranker is served); scores are sigmoids of the logits, in [0, 1] as Cohere's."""

    model_config = ConfigDict(extra="ignore")

    query: StrictStr
    documents: list[StrictStr | CohereDocument]
    model: StrictStr | None = None
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    max_tokens_per_doc: StrictInt | None = Field(default=None, ge=1)
