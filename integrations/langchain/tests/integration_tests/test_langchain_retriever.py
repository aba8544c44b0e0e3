"""BGEM3QdrantIndex + BGEM3Retriever on the embedded Qdrant, checked against the core encoder."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.optional import require_module

require_module("langchain_qdrant")
require_module("bgem3_qdrant")

from langchain_bgem3 import BGEM3Embeddings, BGEM3QdrantIndex, BGEM3Retriever  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from qdrant_client import QdrantClient, models  # noqa: E402


@pytest.fixture
def index(lc_encoder: Any, corpus: list[str]) -> BGEM3QdrantIndex:
    client = QdrantClient(location=":memory:")
    idx = BGEM3QdrantIndex(client=client, collection_name="notes", encoder=lc_encoder)
    docs = [Document(page_content=t, metadata={"i": i, "lang": "en" if i % 2 == 0 else "xx"})
            for i, t in enumerate(corpus)]
    ids = idx.add_documents(docs)
    assert len(ids) == len(set(ids)) == len(corpus)
    return idx


def test_exact_text_first_with_scores_in_metadata(index: BGEM3QdrantIndex, corpus: list[str]) -> None:
    retriever = index.as_retriever(k=3)
    for i, text in enumerate(corpus):
        docs = retriever.invoke(text)
        assert len(docs) == 3
        assert docs[0].page_content == text and docs[0].metadata["i"] == i
        meta = docs[0].metadata
        assert meta["colbert_score"] == pytest.approx(1.0, abs=1e-5)  # each query vector finds itself
        for key in ("score", "dense_score", "sparse_score", "_id", "doc_id", "source", "chunk_index"):
            assert key in meta
        assert docs[0].id == meta["_id"]
        scores = [d.metadata["score"] for d in docs]
        assert scores == sorted(scores, reverse=True)


def test_order_equals_core_colbert_score(index: BGEM3QdrantIndex, lc_encoder: Any, corpus: list[str]) -> None:
    """Qdrant's MAX_SIM rerank gives the core's colbert_score order (and value) on the same candidates."""
    retriever = index.as_retriever(k=len(corpus), prefetch_limit=len(corpus))
    for query in ["dense and sparse retrieval of documents", corpus[2], "what is machine learning?"]:
        docs = retriever.invoke(query)
        assert len(docs) == len(corpus)  # every text is a candidate
        q_out = lc_encoder.encode_queries([query], return_dense=False, return_colbert_vecs=True)
        q = q_out["colbert_vecs"][0]
        p = lc_encoder.encode_corpus([d.page_content for d in docs], return_dense=False,
                                     return_colbert_vecs=True)["colbert_vecs"]
        core = np.array([lc_encoder.colbert_score(q, v) for v in p])
        got = np.array([d.metadata["colbert_score"] for d in docs])
        np.testing.assert_allclose(got, core, atol=1e-5)
        # Same order: the retriever's list is sorted by the core's score (ties within float noise aside).
        assert np.all(np.diff(core) <= 1e-6), core


def test_k_filter_and_overrides(index: BGEM3QdrantIndex, corpus: list[str]) -> None:
    retriever = index.as_retriever(k=2, filter={"lang": "en"})
    docs = retriever.invoke(corpus[1])
    assert len(docs) == 2 and all(d.metadata["lang"] == "en" for d in docs)
    docs = retriever.invoke(corpus[1], filter={"lang": "xx"}, k=1)
    assert [d.page_content for d in docs] == [corpus[1]]
    qfilter = models.Filter(must=[models.FieldCondition(key="metadata.i", match=models.MatchAny(any=[3, 5]))])
    docs = retriever.invoke(corpus[3], filter=qfilter, k=5)
    assert sorted(d.metadata["i"] for d in docs) == [3, 5]
    for mode in ("hybrid", "dense", "sparse"):
        assert retriever.invoke(corpus[4], mode=mode, filter=None)[0].page_content == corpus[4]
    assert asyncio.run(retriever.ainvoke(corpus[0], k=1))[0].page_content == corpus[0]


def test_readding_is_idempotent_and_delete(index: BGEM3QdrantIndex, corpus: list[str]) -> None:
    count = index.client.count("notes").count
    index.add_documents([Document(page_content=corpus[0], metadata={"i": 0, "lang": "en"})])
    assert index.client.count("notes").count == count  # same content -> same id -> nothing new
    ids = index.add_texts(["a new note about sourdough bread"], metadatas=[{"i": 99}], ids=["bread"])
    assert ids == ["bread"] and index.client.count("notes").count == count + 1
    index.delete(["bread"])
    assert index.client.count("notes").count == count


@pytest.mark.parametrize("mode", ["dense", "sparse", "hybrid"])
def test_qdrant_vector_store_reads_the_same_collection(
    index: BGEM3QdrantIndex, corpus: list[str], mode: str
) -> None:
    store = index.as_vector_store(retrieval_mode=mode)
    for i, text in enumerate(corpus):
        doc, _score = store.similarity_search_with_score(text, k=2)[0]
        assert doc.page_content == text and doc.metadata["i"] == i


def test_shares_the_encoder_of_other_components(lc_encoder: Any) -> None:
    dense = BGEM3Embeddings(encoder=lc_encoder)
    retriever = BGEM3Retriever(client=QdrantClient(location=":memory:"), collection_name="x", encoder=dense)
    assert retriever.encoder is lc_encoder


def test_retriever_add_documents_on_disk(tmp_path: Path, lc_encoder: Any, corpus: list[str]) -> None:
    """The embedded on-disk store (writes happen on bgem3-qdrant's writer thread)."""
    from bgem3_qdrant import open_store, resolve_target

    client = open_store(resolve_target(path=str(tmp_path / "qdrant")))
    try:
        retriever = BGEM3Retriever(client=client, collection_name="notes", encoder=lc_encoder, k=1)
        retriever.add_documents([Document(page_content=t) for t in corpus])
        assert retriever.invoke(corpus[5])[0].page_content == corpus[5]
    finally:
        client.close()


def test_missing_collection_is_a_clear_error(lc_encoder: Any) -> None:
    from bgem3_qdrant import CollectionNotFoundError

    client = QdrantClient(location=":memory:")
    retriever = BGEM3Retriever(client=client, collection_name="nope", encoder=lc_encoder)
    with pytest.raises(CollectionNotFoundError, match="nope"):
        retriever.invoke("anything")


def test_open_on_a_path_is_qdrant_edge_and_stores_the_encoded_text(
    tmp_path: Path, lc_encoder: Any, tiny_checkpoint: Path
) -> None:
    """A folder opens bgem3-qdrant's Qdrant Edge store. Stored chunk text is trimmed and is exactly what
    was encoded: its offsets point into the source text and its stored vectors are the reference's
    (transformers' model + FlagEmbedding head semantics) for that text."""
    from tests.support import ReferenceM3

    body = " ".join(f"Sentence number {i} talks about topic {i % 5}." for i in range(12))
    source = f"  \n{body}\n\n  "
    with BGEM3QdrantIndex.open("notes", lc_encoder, path=str(tmp_path / "qd"), chunk_size=24,
                               chunk_overlap=4) as index:
        assert index.client.kind == "edge"
        (doc_id,) = index.add_texts([source], metadatas=[{"lang": "en"}])
        points = list(index.client.iter_points("notes", with_vectors=True))
        assert len(points) > 2  # chunked
        texts = [p.payload["text"] for p in points]
        for p, text in zip(points, texts, strict=True):
            assert p.payload["doc_id"] == doc_id
            assert text == text.strip() and text
            assert source[p.payload["char_start"] : p.payload["char_end"]] == text
        ref = ReferenceM3(tiny_checkpoint).encode(texts)
        for i, p in enumerate(points):
            where = f"chunk {i}: {texts[i]!r}"
            dense = ref["dense_vecs"][i]
            np.testing.assert_allclose(p.vectors["dense"], dense, rtol=1e-4, atol=1e-5, err_msg=where)
            indices, values = p.vectors["sparse"]
            stored = {str(int(k)): float(v) for k, v in zip(indices, values, strict=True)}
            assert stored == pytest.approx(ref["lexical_weights"][i], rel=1e-5, abs=1e-5), where
            # ColBERT is stored as float16 by default: the reference's rows rounded to half precision
            # (unit-vector entries, so within 2.5e-4 of them).
            colbert = ref["colbert_vecs"][i]
            np.testing.assert_allclose(p.vectors["colbert"], colbert, atol=2.5e-4, err_msg=where)
        assert index.as_retriever(k=1).invoke(texts[1])[0].page_content == texts[1]
        with pytest.raises(ValueError, match="needs a QdrantClient"):
            index.as_vector_store()
        index.delete([doc_id])
        assert index.client.count("notes") == 0
    # Closed: the folder can be opened again (one process at a time holds it).
    with BGEM3QdrantIndex.open("notes", lc_encoder, path=str(tmp_path / "qd")) as again:
        assert again.client.count("notes") == 0


def test_client_of_another_kind_is_refused(lc_encoder: Any) -> None:
    with pytest.raises(ValueError, match="open_store"):
        BGEM3Retriever(client="./qdrant_data", collection_name="x", encoder=lc_encoder)


def test_an_empty_query_is_one_error(index: BGEM3QdrantIndex, lc_encoder: Any) -> None:
    """The rule every query follows (bgem3_embeddings.query_text): the retriever and the embeddings' query
    paths refuse a query without text; documents are embedded whatever they hold, as the reference does."""
    from langchain_bgem3 import BGEM3SparseEmbeddings

    from bgem3_embeddings.query_text import EMPTY_QUERY

    dense, sparse = BGEM3Embeddings(encoder=lc_encoder), BGEM3SparseEmbeddings(encoder=lc_encoder)
    calls = [lambda: index.as_retriever(k=2).invoke(""), lambda: index.as_retriever().invoke(" \n"),
             lambda: dense.embed_query("  "), lambda: sparse.embed_query(""),
             lambda: asyncio.run(dense.aembed_query("\t"))]  # fmt: skip
    for call in calls:
        with pytest.raises(ValueError) as refused:
            call()
        assert str(refused.value) == EMPTY_QUERY
    assert len(dense.embed_documents([""])[0]) == lc_encoder.hidden_size


def test_source_is_the_documents_own_or_empty(tmp_path: Path, lc_encoder: Any) -> None:
    """The README's quick start shape: a Document without `source` is stored and found with an empty
    source (not its content hash, which is its doc_id), one with source="notes/router.md" keeps that name;
    `bgem3-qdrant check` finds both points sound."""
    from bgem3_qdrant.check import check_collection

    docs = [Document(page_content="Hold the reset button for ten seconds.", metadata={"lang": "en"}),
            Document(page_content="The router's light blinks orange while it updates.",
                     metadata={"lang": "en", "source": "notes/router.md"})]
    with BGEM3QdrantIndex.open("notes", lc_encoder, path=str(tmp_path / "qd")) as index:
        no_source, router = index.add_documents(docs)
        stored = {p.payload["doc_id"]: p.payload["source"] for p in index.client.iter_points("notes")}
        assert stored == {no_source: "", router: "notes/router.md"}
        hits = {d.page_content: d.metadata for d in index.as_retriever(k=2).invoke("reset the router")}
        first, second = hits[docs[0].page_content], hits[docs[1].page_content]
        assert first["source"] == "" and first["doc_id"] == no_source
        assert second["source"] == "notes/router.md"
        assert check_collection(index.client, "notes").damaged == []


def test_a_cut_query_is_logged_with_its_counts(
    index: BGEM3QdrantIndex, lc_encoder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 58 item 7: a query past the query max length is said (logger langchain_bgem3), once per
    query, by the retriever and by embed_query; a query within it says nothing."""
    from langchain_bgem3 import BGEM3Embeddings

    long_query = "what does the starter need " * 60
    whole = len(lc_encoder.tokenize([long_query], 100_000)[0])
    kept = int(lc_encoder.query_max_length)
    note = f"the query has {whole:,} tokens, more than the model reads: only its first {kept:,} were used"
    with caplog.at_level(logging.WARNING, logger="langchain_bgem3"):
        index.as_retriever(k=2).invoke(long_query)
        BGEM3Embeddings(encoder=lc_encoder).embed_query(long_query)
        short_limit = BGEM3Embeddings(encoder=lc_encoder, query_encode_kwargs={"max_length": 8})
        short_limit.embed_query("a b c d e f g h")
        index.as_retriever(k=2).invoke("sourdough")
    said = [r.getMessage() for r in caplog.records]
    cut_at_8 = len(lc_encoder.tokenize(["a b c d e f g h"], 100)[0])
    assert said == [
        f"{note} (max length)",
        f"{note} (max length)",
        f"the query has {cut_at_8} tokens, more than the model reads: only its first 8 were used"
        " (max length)",
    ]
