"""ColBERT (multi-vector) reranking of retrieved nodes with BGE-M3, as a LlamaIndex node postprocessor."""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from bgem3_embeddings.query_text import check_query

from ._shared import DEFAULT_EMBED_BATCH_SIZE, DEFAULT_MODEL, EncoderOwnerMixin, build_encoder, locked_call


class BGEM3ColbertRerank(EncoderOwnerMixin, BaseNodePostprocessor):
    """Rerank candidates by the BGE-M3 ColBERT score (mean over query tokens of the best passage match).

    LlamaIndex's QdrantVectorStore stores no multi-vectors, so the candidates' ColBERT vectors are computed
    here, at query time: keep the candidate list short (tens of nodes). For stored ColBERT vectors
    reranked inside Qdrant (Qdrant Edge for a folder, or a server), use BGEM3QdrantRetriever.
    """

    model_name: str = Field(default=DEFAULT_MODEL, description="Hub id or local checkpoint directory.")
    top_n: int | None = Field(default=None, description="Nodes to keep after reranking (None: all).")
    batch_size: int = Field(default=DEFAULT_EMBED_BATCH_SIZE, gt=0, description="Passages per forward pass.")
    query_max_length: int | None = Field(default=None, gt=0, description="None: the encoder's limit.")
    passage_max_length: int | None = Field(default=None, gt=0, description="None: the encoder's limit.")
    keep_retrieval_score: bool = Field(
        default=False, description="Keep the retriever's score in node metadata as 'retrieval_score'."
    )
    encoder: Any = Field(default=None, exclude=True, description="An existing BGEM3Encoder to reuse.")

    def _build_encoder(self) -> Any:
        return build_encoder(
            self.model_name,
            precision="auto",
            device="auto",
            batch_size=self.batch_size,
            query_max_length=self.query_max_length,
            passage_max_length=self.passage_max_length,
            cache_folder=None,
            model_kwargs={},
        )

    @classmethod
    def class_name(cls) -> str:
        return "BGEM3ColbertRerank"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("BGEM3ColbertRerank needs the query (query_bundle or query_str)")
        check_query(query_bundle.query_str)  # the rule every query follows (bgem3_embeddings.query_text)
        if not nodes:
            return []
        enc = self.encoder
        texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]

        def run() -> tuple[Any, list[Any]]:
            q = enc.encode_queries(
                [query_bundle.query_str],
                max_length=self.query_max_length,
                return_dense=False,
                return_colbert_vecs=True,
            )["colbert_vecs"][0]
            p = enc.encode_corpus(
                texts,
                batch_size=self.batch_size,
                max_length=self.passage_max_length,
                return_dense=False,
                return_colbert_vecs=True,
            )["colbert_vecs"]
            return q, p

        q_vecs, p_vecs = locked_call(enc, run)
        rescored = []
        for n, vecs in zip(nodes, p_vecs, strict=True):
            if self.keep_retrieval_score:
                n.node.metadata["retrieval_score"] = n.score
            rescored.append(NodeWithScore(node=n.node, score=float(enc.colbert_score(q_vecs, vecs))))
        rescored.sort(key=lambda n: n.score or 0.0, reverse=True)
        return rescored[: self.top_n] if self.top_n is not None else rescored
