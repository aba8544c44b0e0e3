"""BGE-M3 dense embeddings as a LangChain `Embeddings`."""

from __future__ import annotations

from langchain_core.embeddings import Embeddings
from langchain_core.runnables.config import run_in_executor

from langchain_bgem3._base import BGEM3EncoderMixin


class BGEM3Embeddings(BGEM3EncoderMixin, Embeddings):
    """BGE-M3 dense vectors (CLS, L2-normalised; 1024 dimensions for BAAI/bge-m3).

    Example:
        ```python
        from langchain_bgem3 import BGEM3Embeddings, BGEM3SparseEmbeddings

        dense = BGEM3Embeddings(model_name="BAAI/bge-m3", model_kwargs={"device": "auto"})
        sparse = BGEM3SparseEmbeddings(encoder=dense.encoder)  # same model, loaded once
        vectors = dense.embed_documents(["BGE M3 is an embedding model."])
        ```
    """

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed passages in one call to the encoder (it batches and sorts by length itself)."""
        if not texts:
            return []
        out = self._encode(texts, query=False, return_dense=True, return_sparse=False,
                           return_colbert_vecs=False)
        return out["dense_vecs"].tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (query_max_length truncation)."""
        out = self._encode([text], query=True, return_dense=True, return_sparse=False,
                           return_colbert_vecs=False)
        return out["dense_vecs"][0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async embed_documents: runs in a worker thread so the event loop stays free."""
        return await run_in_executor(None, self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """Async embed_query: runs in a worker thread so the event loop stays free."""
        return await run_in_executor(None, self.embed_query, text)
