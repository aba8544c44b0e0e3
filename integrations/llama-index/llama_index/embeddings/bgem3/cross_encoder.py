"""BGE's cross-encoder (BAAI/bge-reranker-v2-m3, `bgem3_embeddings.BGEM3Reranker`) as a LlamaIndex node
postprocessor: the retrieved nodes ordered by the model that reads the query and each node together.

    from llama_index.embeddings.bgem3 import BGEM3CrossEncoderRerank
    rerank = BGEM3CrossEncoderRerank(model_name="BAAI/bge-reranker-v2-m3", top_n=3)
    engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[rerank])

As LlamaIndex's `FlagEmbeddingReranker` (which needs torch and FlagEmbedding), the score is the
cross-encoder's logit (its sigmoid with `normalize=True`) of each node's text with its metadata as the
embedding model sees it; `keep_retrieval_score` keeps the retriever's score in the node's metadata.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from ._shared import locked_call, require

DEFAULT_RERANKER = "BAAI/bge-reranker-v2-m3"


class BGEM3CrossEncoderRerank(BaseNodePostprocessor):
    """Rerank nodes by bge-reranker-v2-m3 (a cross-encoder), keeping the best `top_n`."""

    model_name: str = Field(default=DEFAULT_RERANKER, description="Hub id or local checkpoint directory.")
    top_n: int | None = Field(default=3, gt=0, description="Nodes to keep after reranking (None: all).")
    normalize: bool = Field(default=False, description="Scores as the sigmoid of the logit, in (0, 1).")
    keep_retrieval_score: bool = Field(
        default=False, description="Keep the retriever's score in node metadata as 'retrieval_score'."
    )
    model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="BGEM3Reranker's options (precision, device, max_length, ...)."
    )
    reranker: Any = Field(default=None, exclude=True, description="An existing BGEM3Reranker to reuse.")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.reranker is None:
            core = require("bgem3_embeddings", "bgem3-embeddings", "the cross-encoder reranker")
            self.reranker = core.BGEM3Reranker(self.model_name, **self.model_kwargs)
        elif not all(hasattr(self.reranker, m) for m in ("compute_score", "rerank")):
            raise TypeError(
                "reranker must be a bgem3_embeddings.BGEM3Reranker, got "
                f"{type(self.reranker).__name__} without compute_score / rerank"
            )

    @classmethod
    def class_name(cls) -> str:
        return "BGEM3CrossEncoderRerank"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("BGEM3CrossEncoderRerank needs the query (query_bundle or query_str)")
        if not nodes:
            return []
        texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]
        reranker = self.reranker
        ranked = locked_call(
            reranker,
            lambda: reranker.rerank(
                query_bundle.query_str, texts, top_n=self.top_n, normalize=self.normalize
            ),
        )
        out = []
        for index, score in ranked:
            node = nodes[index]
            if self.keep_retrieval_score:
                node.node.metadata["retrieval_score"] = node.score
            out.append(NodeWithScore(node=node.node, score=float(score)))
        return out
