"""BGEM3CrossEncoderRerank in LlamaIndex's own pipeline: a VectorStoreIndex on BGEM3Embedding, its query
engine with the postprocessor (MockLLM: no model answers), the nodes ordered as `BGEM3Reranker.rerank`
orders the retriever's candidates (tiny checkpoints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import Document, MetadataMode, QueryBundle
from llama_index.embeddings.bgem3 import BGEM3CrossEncoderRerank, BGEM3Embedding

from tests.support import assert_reordered

QUERY = "What returns the most relevant documents?"
DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "A search engine returns the documents most relevant to the question of its user.",
    "BGE-M3 produces dense, sparse and multi-vector embeddings.",
    "Espresso is brewed by forcing hot water through ground coffee.",
    "Un motor de búsqueda encuentra los documentos más relevantes para una consulta.",
    "検索エンジンは質問に最も関連する文書を返します。",
]
SCALED = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def reranker(tiny_reranker_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Reranker

    return BGEM3Reranker(tiny_reranker_checkpoint, precision="float32", device="cpu")


@pytest.fixture(scope="module")
def index(tiny_encoder: Any) -> VectorStoreIndex:
    docs = [Document(text=t, metadata={"i": i}) for i, t in enumerate(DOCS)]
    return VectorStoreIndex.from_documents(docs, embed_model=BGEM3Embedding(encoder=tiny_encoder))


def test_query_engine_with_the_postprocessor(index: VectorStoreIndex, reranker: Any) -> None:
    candidates = index.as_retriever(similarity_top_k=5).retrieve(QUERY)
    texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in candidates]
    want = reranker.rerank(QUERY, texts, top_n=3)
    assert_reordered([i for i, _ in want])  # else the retriever's own order would pass
    rerank = BGEM3CrossEncoderRerank(reranker=reranker, top_n=3)
    engine = index.as_query_engine(similarity_top_k=5, node_postprocessors=[rerank], llm=MockLLM())
    nodes = engine.query(QUERY).source_nodes
    assert [n.node.node_id for n in nodes] == [candidates[i].node.node_id for i, _ in want]
    np.testing.assert_allclose([n.score for n in nodes], [s for _, s in want], **SCALED)


def test_normalize_keep_retrieval_score_and_loading_by_name(
    index: VectorStoreIndex, reranker: Any, tiny_reranker_checkpoint: Path
) -> None:
    candidates = index.as_retriever(similarity_top_k=3).retrieve(QUERY)
    retrieval = {n.node.node_id: n.score for n in candidates}
    rerank = BGEM3CrossEncoderRerank(
        model_name=str(tiny_reranker_checkpoint),
        model_kwargs={"precision": "float32", "device": "cpu"},
        top_n=None,
        normalize=True,
        keep_retrieval_score=True,
    )
    # before: keep_retrieval_score adds to the nodes' metadata, which their embedding text includes
    texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in candidates]
    nodes = rerank.postprocess_nodes(candidates, QueryBundle(QUERY))
    want = dict(reranker.rerank(QUERY, texts, normalize=True))
    assert len(nodes) == 3 and all(0 < (n.score or 0) < 1 for n in nodes)
    for n in nodes:
        assert n.node.metadata["retrieval_score"] == retrieval[n.node.node_id]
        i = next(j for j, c in enumerate(candidates) if c.node.node_id == n.node.node_id)
        np.testing.assert_allclose(n.score, want[i], **SCALED)
    assert rerank.postprocess_nodes([], QueryBundle(QUERY)) == []
    with pytest.raises(TypeError, match="BGEM3Reranker"):
        BGEM3CrossEncoderRerank(reranker=object())
