"""LlamaIndex hybrid retrieval with BGE-M3 over an embedded Qdrant, optionally reranked with ColBERT.

    pip install -e . -e integrations/qdrant -e "integrations/llama-index[qdrant]"   # from the clone
    python examples/llama_index_hybrid.py "Which model has sparse and ColBERT outputs?" --rerank colbert

BGEM3_MODEL: hub id or local checkpoint directory (default BAAI/bge-m3, 2.3 GB on first use).

One BGE-M3 model is loaded and shared by the dense embedding, the sparse encoders and the reranker.
Rerank modes:
  none     hybrid only: Qdrant dense + sparse candidates, fused by LlamaIndex (relative score fusion)
  colbert  + BGEM3ColbertRerank: a LlamaIndex postprocessor computing the candidates' ColBERT vectors
  qdrant   BGEM3QdrantRetriever on bgem3-qdrant's store (Qdrant Edge in a folder): ColBERT vectors are
           stored at ingest and Qdrant reranks the dense + sparse candidates by MAX_SIM in one Query API
           call

LlamaIndex's own QdrantVectorStore (none, colbert) needs a QdrantClient, so those modes use qdrant-client's
local mode (small data; run a server beyond some thousands of chunks); the qdrant mode uses Qdrant Edge.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.schema import NodeWithScore
from llama_index.embeddings.bgem3 import (
    BGEM3ColbertRerank,
    BGEM3Embedding,
    BGEM3QdrantRetriever,
    qdrant_hybrid_vector_store,
)
from qdrant_client import QdrantClient

from bgem3_embeddings.install_hint import pip_install

DOCS = [
    "BGE-M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function that ranks documents based on the query terms they contain.",
    "Qdrant is a vector database: one collection can hold dense, sparse and multi-vector fields.",
    "ColBERT keeps one vector per token and scores a query against a passage with late interaction.",
    "LlamaIndex builds retrieval-augmented generation pipelines from documents, indexes and retrievers.",
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
    "Espresso is brewed by forcing hot water through finely ground coffee.",
    "Photosynthesis converts light energy into chemical energy in plants.",
]
COLLECTION = "llama_index_bgem3"

if TYPE_CHECKING:
    from qdrant_client import QdrantClient


def load_embedding(model: str) -> BGEM3Embedding:
    """The dense embedding; its `.encoder` (the one loaded model) is shared by everything else."""
    return BGEM3Embedding(model_name=model, embed_batch_size=32)


def token_splitter(embed: BGEM3Embedding, chunk_size: int = 512) -> SentenceSplitter:
    """Chunks counted in BGE-M3 tokens (LlamaIndex's default counts tiktoken tokens)."""
    tok = embed.encoder.tokenizer
    return SentenceSplitter(
        chunk_size=chunk_size, chunk_overlap=32, tokenizer=lambda t: tok.encode(t, add_special_tokens=False)
    )


def build_index(embed: BGEM3Embedding, client: QdrantClient) -> VectorStoreIndex:
    """Ingest DOCS through LlamaIndex into a hybrid (dense + sparse) Qdrant collection."""
    store = qdrant_hybrid_vector_store(COLLECTION, encoder=embed, client=client)
    nodes = token_splitter(embed).get_nodes_from_documents([Document(text=t) for t in DOCS])
    return VectorStoreIndex(
        nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed
    )


def qdrant_rerank(query: str, embed: BGEM3Embedding, path: str, *, top_k: int) -> list[NodeWithScore]:
    """Store DOCS with all three vectors in Qdrant Edge at `path`, then one dense + sparse + ColBERT query."""
    _bgem3_qdrant()  # the install hint, if missing
    with BGEM3QdrantRetriever.open(COLLECTION, embed, path=path, k=top_k) as retriever:
        nodes = token_splitter(embed).get_nodes_from_documents([Document(text=t) for t in DOCS])
        retriever.add_documents(nodes)  # already stored chunks are skipped on a re-run
        return retriever.retrieve(query)  # scores: the reference ColBERT score


def search(
    query: str, index: VectorStoreIndex, embed: BGEM3Embedding, *, rerank: str, top_k: int
) -> list[NodeWithScore]:
    """Hybrid retrieval (LlamaIndex's QdrantVectorStore), then the chosen ColBERT rerank."""
    # with a rerank, widen the candidate list and keep the ColBERT top_k
    n_candidates = 4 * top_k if rerank == "colbert" else top_k
    retriever = index.as_retriever(
        vector_store_query_mode="hybrid", similarity_top_k=n_candidates, sparse_top_k=4 * top_k
    )
    if rerank == "colbert":
        reranker = BGEM3ColbertRerank(encoder=embed, top_n=top_k)
        return reranker.postprocess_nodes(retriever.retrieve(query), query_str=query)
    return retriever.retrieve(query)


def _bgem3_qdrant() -> Any:
    try:
        import bgem3_qdrant
    except ImportError as exc:
        raise ImportError(
            f"--rerank qdrant needs bgem3-qdrant: run `{pip_install('bgem3-qdrant')}`"
        ) from exc
    return bgem3_qdrant


def main(argv: list[str] | None = None) -> list[NodeWithScore]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "query", nargs="?", default="Which model supports dense, sparse and ColBERT retrieval?"
    )
    parser.add_argument("--rerank", choices=["none", "colbert", "qdrant"], default="none")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--path", help="store directory (default: a temporary one)")
    args = parser.parse_args(argv)

    try:
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise ImportError(
            "this example needs the qdrant extra: run "
            f"`{pip_install('llama-index-embeddings-bgem3[qdrant]')}`"
        ) from exc
    embed = load_embedding(os.environ.get("BGEM3_MODEL", "BAAI/bge-m3"))
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or str(Path(tmp) / "qdrant")
        if args.rerank == "qdrant":
            results = qdrant_rerank(args.query, embed, path, top_k=args.top_k)
        else:
            # one process at a time may open a local-mode path
            client = QdrantClient(path=path)
            try:
                with warnings.catch_warnings():
                    # LlamaIndex asks for payload indexes, which local mode ignores and warns about on
                    # every run; expected here (local mode is for small data): keep the output clean.
                    warnings.filterwarnings("ignore", message="Payload indexes have no effect in the local")
                    if client.collection_exists(COLLECTION):
                        client.delete_collection(COLLECTION)  # the example re-ingests DOCS on each run
                    index = build_index(embed, client)
                    results = search(args.query, index, embed, rerank=args.rerank, top_k=args.top_k)
            finally:
                client.close()
    print(f"query: {args.query}  (rerank: {args.rerank})")
    for rank, hit in enumerate(results, 1):
        print(f"{rank}. {hit.score:.4f}  {hit.node.get_content()}")
    return results


if __name__ == "__main__":
    main()
