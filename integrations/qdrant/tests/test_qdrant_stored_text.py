"""What `ingest` stores is the reference's output for the text it stores (issue 12, item 2).

The project's own example corpus (10 files, 8 languages, Markdown, JSONL) is ingested with small chunks
so most chunks start or end at whitespace; every stored chunk text must be trimmed, point into its source
and carry exactly the vectors transformers' model + FlagEmbedding's head semantics give for that text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import open_store, resolve_target
from bgem3_qdrant.ingest import IngestOptions, Ingestor
from bgem3_qdrant.schema import CollectionSchema

CORPUS = Path(__file__).resolve().parents[3] / "examples" / "corpus"


@pytest.mark.parametrize("engine", ["edge", "local"])
def test_stored_chunks_are_trimmed_and_carry_the_reference_vectors(
    engine: str, encoder: Any, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    from tests.support import ReferenceM3

    store = open_store(resolve_target(path=str(tmp_path / "qd"), engine=engine))
    try:
        schema = CollectionSchema(size=encoder.hidden_size, colbert_dtype="float32")  # exact copies
        opts = IngestOptions(chunk_size=40, chunk_overlap=8, batch_size=16, show_progress=False)
        Ingestor(store, "corpus", encoder, schema=schema, options=opts).ingest_paths([CORPUS])
        points = list(store.iter_points("corpus", with_vectors=True))
    finally:
        store.close()

    assert len(points) > 50, "the corpus should give many small chunks"
    texts = [p.payload["text"] for p in points]
    for p, text in zip(points, texts, strict=True):
        assert text and text == text.strip(), f"stored text has surrounding whitespace: {text!r}"
        source = Path(p.payload["source"])
        if source.suffix in (".md", ".txt"):  # offsets point into the file's text
            whole = source.read_text(encoding="utf-8")
            assert whole[p.payload["char_start"] : p.payload["char_end"]] == text

    ref = ReferenceM3(tiny_checkpoint).encode(texts)
    for i, p in enumerate(points):
        where = f"chunk {i}: {texts[i]!r}"
        np.testing.assert_allclose(p.vectors["dense"], ref["dense_vecs"][i], atol=1e-5, err_msg=where)
        np.testing.assert_allclose(p.vectors["colbert"], ref["colbert_vecs"][i], atol=1e-5, err_msg=where)
        indices, values = p.vectors["sparse"]
        stored = {str(int(k)): float(v) for k, v in zip(indices, values, strict=True)}
        assert stored.keys() == ref["lexical_weights"][i].keys(), where
        assert stored == pytest.approx(ref["lexical_weights"][i], rel=1e-5, abs=1e-5), where
