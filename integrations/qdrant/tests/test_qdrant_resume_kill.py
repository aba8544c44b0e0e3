"""A run killed with SIGKILL in the middle, then re-run, stores every chunk exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from bgem3_embeddings import BGEM3Encoder
    from bgem3_qdrant import IngestOptions, Ingestor
    from bgem3_qdrant import open_store, resolve_target

    checkpoint, store, corpus, engine = sys.argv[1:5]
    enc = BGEM3Encoder(checkpoint)
    real = enc.encode_corpus
    calls = 0

    def encode_then_die(texts, **kw):
        # Die hard on the 4th batch: earlier batches are written or in flight, nothing is cleaned up.
        global calls
        calls += 1
        if calls == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(texts, **kw)

    enc.encode_corpus = encode_then_die
    client = open_store(resolve_target(path=store, engine=engine))
    opts = IngestOptions(chunk_size=24, chunk_overlap=4, batch_size=4, show_progress=False)
    Ingestor(client, "docs", enc, options=opts, model_id="tiny").ingest_paths([corpus])
    print("finished without being killed")
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
@pytest.mark.parametrize("engine", ["edge", "local"])
def test_sigkill_mid_run_then_rerun(
    tmp_path: Path, tiny_checkpoint: Path, encoder: Any, corpus: Path, engine: str
) -> None:
    store = str(tmp_path / "store")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tiny_checkpoint), store, str(corpus), engine],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    client = open_store(resolve_target(path=store, engine=engine))  # the killed process's lock is gone
    try:
        partial = client.count("docs")
        assert 0 < partial <= 12  # at most the three batches before the kill
        opts = IngestOptions(chunk_size=24, chunk_overlap=4, batch_size=4, show_progress=False)
        summary = Ingestor(client, "docs", encoder, options=opts, model_id="tiny").ingest_paths([corpus])
        assert summary.unchanged == partial and summary.encoded == summary.chunks - partial
        keys = [(r.payload["doc_id"], r.payload["chunk_index"]) for r in client.iter_points("docs")]
        assert len(keys) == len(set(keys)) == summary.chunks
    finally:
        client.close()
