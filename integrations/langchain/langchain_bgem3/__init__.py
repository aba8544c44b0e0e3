"""BGE-M3 (dense, sparse, ColBERT) as LangChain components.

`BGEM3Embeddings` needs only langchain-core. `BGEM3SparseEmbeddings`, `BGEM3Retriever` and
`BGEM3QdrantIndex` need the `qdrant` extra (from the clone: `pip install -e integrations/qdrant -e
"integrations/langchain[qdrant]"`); they are imported lazily so the package imports without it.
`BGEM3CrossEncoderRerank` (a document compressor) and `BGEM3CrossEncoder` (langchain-classic's
`CrossEncoderReranker` model) run BGE's cross-encoder, bge-reranker-v2-m3.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from langchain_bgem3.embeddings import BGEM3Embeddings

if TYPE_CHECKING:
    from langchain_bgem3.rerank import BGEM3CrossEncoder, BGEM3CrossEncoderRerank
    from langchain_bgem3.retriever import BGEM3QdrantIndex, BGEM3Retriever
    from langchain_bgem3.sparse import BGEM3SparseEmbeddings

__version__ = "0.1.0"

_LAZY = {
    "BGEM3CrossEncoder": "langchain_bgem3.rerank",
    "BGEM3CrossEncoderRerank": "langchain_bgem3.rerank",
    "BGEM3SparseEmbeddings": "langchain_bgem3.sparse",
    "BGEM3Retriever": "langchain_bgem3.retriever",
    "BGEM3QdrantIndex": "langchain_bgem3.retriever",
}

__all__ = [
    "BGEM3CrossEncoder",
    "BGEM3CrossEncoderRerank",
    "BGEM3Embeddings",
    "BGEM3QdrantIndex",
    "BGEM3Retriever",
    "BGEM3SparseEmbeddings",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'langchain_bgem3' has no attribute {name!r}")
