"""Against a real Qdrant server: runs only when QDRANT_URL is set (docker run -p 6333:6333 qdrant/qdrant)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant import IngestOptions, Ingestor, Searcher, open_store, resolve_target

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not os.environ.get("QDRANT_URL"), reason="QDRANT_URL is not set"),
]


def test_server_ingest_search_rerun(encoder: Any, corpus: Path) -> None:
    client = open_store(resolve_target())
    name = f"bgem3-test-{uuid.uuid4().hex[:8]}"
    try:
        opts = IngestOptions(chunk_size=24, chunk_overlap=4, batch_size=8, show_progress=False)
        first = Ingestor(client, name, encoder, options=opts).ingest_paths([corpus])
        again = Ingestor(client, name, encoder, options=opts).ingest_paths([corpus])
        assert again.encoded == 0 and client.count(name).count == first.chunks
        rec, _ = client.scroll(name, limit=1, with_payload=True)
        for mode in ("dense", "sparse", "hybrid", "rerank"):
            hits = Searcher(client, name, encoder).search(rec[0].payload["text"], mode=mode, limit=3)
            assert hits[0].id == str(rec[0].id)
    finally:
        client.delete_collection(name)
        client.close()
