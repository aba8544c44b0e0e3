"""BGE-M3 lexical weights as a langchain_qdrant `SparseEmbeddings`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langchain_core.runnables.config import run_in_executor

from bgem3_embeddings.outputs import sparse_arrays
from langchain_bgem3._base import BGEM3EncoderMixin
from langchain_bgem3._encoder import import_optional

if TYPE_CHECKING:
    from langchain_qdrant import SparseEmbeddings, SparseVector
else:
    # langchain-qdrant is an optional extra: fail at import of this module with the pip command to run.
    _lq = import_optional("langchain_qdrant", "langchain-qdrant", extra="qdrant")
    SparseEmbeddings = _lq.SparseEmbeddings
    SparseVector = _lq.SparseVector


def to_sparse_vector(weights: dict[Any, float]) -> SparseVector:
    """{token_id: weight} -> SparseVector with unique, sorted int indices (the core's one conversion:
    weights <= 0 dropped, the largest kept for a repeated id)."""
    indices, values = sparse_arrays(weights)
    return SparseVector(indices=indices.tolist(), values=values.tolist())


class BGEM3SparseEmbeddings(BGEM3EncoderMixin, SparseEmbeddings):
    """BGE-M3 lexical weights (token id -> weight) for Qdrant sparse vectors.

    Use with `QdrantVectorStore(retrieval_mode=RetrievalMode.SPARSE or HYBRID, sparse_embedding=...)`.
    The dot product of two of these vectors is the reference lexical matching score, so create the
    sparse index without the IDF modifier to reproduce it.
    """

    def embed_documents(self, texts: list[str]) -> list[SparseVector]:
        """Lexical weights of passages, one encoder call for the whole list."""
        if not texts:
            return []
        out = self._encode(texts, query=False, return_dense=False, return_sparse=True,
                           return_colbert_vecs=False)
        return [to_sparse_vector(w) for w in out["lexical_weights"]]

    def embed_query(self, text: str) -> SparseVector:
        """Lexical weights of one query."""
        out = self._encode([text], query=True, return_dense=False, return_sparse=True,
                           return_colbert_vecs=False)
        return to_sparse_vector(out["lexical_weights"][0])

    async def aembed_documents(self, texts: list[str]) -> list[SparseVector]:
        """Async embed_documents in a worker thread."""
        return await run_in_executor(None, self.embed_documents, texts)

    async def aembed_query(self, text: str) -> SparseVector:
        """Async embed_query in a worker thread."""
        return await run_in_executor(None, self.embed_query, text)
