"""BGE-M3 (dense, sparse, ColBERT) for LlamaIndex, on the Keras/TensorFlow encoder of bgem3-embeddings."""

from llama_index.embeddings.bgem3.base import BGEM3Embedding
from llama_index.embeddings.bgem3.cross_encoder import BGEM3CrossEncoderRerank
from llama_index.embeddings.bgem3.qdrant import qdrant_hybrid_vector_store
from llama_index.embeddings.bgem3.rerank import BGEM3ColbertRerank
from llama_index.embeddings.bgem3.retriever import BGEM3QdrantRetriever
from llama_index.embeddings.bgem3.sparse import (
    BGEM3SparseEmbedding,
    BGEM3SparseEncoder,
    sparse_doc_fn,
    sparse_query_fn,
)

__all__ = [
    "BGEM3ColbertRerank",
    "BGEM3CrossEncoderRerank",
    "BGEM3Embedding",
    "BGEM3QdrantRetriever",
    "BGEM3SparseEmbedding",
    "BGEM3SparseEncoder",
    "qdrant_hybrid_vector_store",
    "sparse_doc_fn",
    "sparse_query_fn",
]
