"""`bgem3-qdrant ingest/search --encoder-url`: encoding through a running `bgem3 serve`, no TensorFlow in
the command's process, and the same model identity as a local encoder (one model per collection)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from bgem3_qdrant import open_store, resolve_target  # noqa: E402
from bgem3_qdrant.encoder import connect_encoder, encode_texts  # noqa: E402
from bgem3_qdrant.identity import identity_of  # noqa: E402
from bgem3_qdrant.search import Searcher  # noqa: E402

from bgem3_embeddings.remote import RemoteEncoderError  # noqa: E402
from tests.support import assert_clean_failure, run_module, tiny_server  # noqa: E402
from tests.tolerances import UNIT_VECTORS  # noqa: E402


@pytest.fixture(scope="module")
def local(tiny_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Encoder

    return BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu", show_progress=False)


@pytest.fixture(scope="module")
def server_url(tiny_checkpoint: Path) -> Iterator[str]:
    with tiny_server(tiny_checkpoint) as url:
        yield url


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`python -X importtime -m bgem3_qdrant ARGS`; returns it and its wall time (s)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "QDRANT_URL")}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bgem3_qdrant", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return done, time.perf_counter() - start


def imported(done: subprocess.CompletedProcess[str]) -> set[str]:
    """Top-level packages the process imported (from -X importtime's lines on stderr)."""
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_ingest_and_search_through_the_server_import_no_tensorflow(
    server_url: str, corpus: Path, tmp_path: Path, local: Any
) -> None:
    store = str(tmp_path / "store")
    ingest, _ = run_cli(
        "ingest", str(corpus), "-c", "kb", "--path", store, "--encoder-url", server_url, "--json"
    )
    assert ingest.returncode == 0, ingest.stderr[-2000:]
    summary = json.loads(ingest.stdout.strip().splitlines()[-1])
    assert summary["encoded"] == summary["chunks"] > 0
    search, seconds = run_cli(
        "search",
        "sourdough starter flour",
        "-c",
        "kb",
        "--path",
        store,
        "--encoder-url",
        server_url,
        "--json",
        "-k",
        "3",
    )
    assert search.returncode == 0, search.stderr[-2000:]
    results = [json.loads(line) for line in search.stdout.splitlines() if line.strip()]  # one per query
    assert len(results) == 1 and results[0]["query"] == "sourdough starter flour"
    hits = results[0]["hits"]
    assert len(hits) == 3 and all(h["query"] == "sourdough starter flour" for h in hits)
    for done in (ingest, search):
        modules = imported(done)
        assert "bgem3_qdrant" in modules
        assert not modules & {"tensorflow", "keras", "torch", "transformers"}, sorted(modules)
    # Nor qdrant-client (a second of start-up) for an Edge store: its filters and stores do without it.
    assert "qdrant_client" not in imported(search), sorted(imported(search))
    print(f"search through the server: {seconds:.2f} s for the whole process")  # shown with -s
    # The collection is one model's: the local encoder of the same checkpoint searches it too.
    with open_store(resolve_target(path=store)) as opened:
        local_hits = Searcher(opened, "kb", local).search("sourdough starter flour", limit=3)
    assert [h.doc_id for h in local_hits] == [h["doc_id"] for h in hits]


def test_remote_encoder_is_the_same_model(server_url: str, local: Any) -> None:
    remote = connect_encoder(server_url)
    assert identity_of(remote).fingerprint == identity_of(local).fingerprint  # type: ignore[union-attr]
    assert remote.hidden_size == local.hidden_size
    texts = ["Feed the sourdough starter once a day.", "Windkraft an Land und auf See", "é"]
    # An empty text is refused by the server, as every text a user sends (issue 58, item 10).
    with pytest.raises(RemoteEncoderError, match=r"answered 400 on /v1/bgem3/encode: `input\[0\]` is empty"):
        encode_texts(remote, [" "], query=False)
    assert remote.tokenizer("Windkraft an Land", return_offsets_mapping=True) == local.tokenizer(
        "Windkraft an Land", return_offsets_mapping=True
    )
    for query in (True, False):
        got, want = encode_texts(remote, texts, query=query), encode_texts(local, texts, query=query)
        np.testing.assert_allclose(got.dense, want.dense, **UNIT_VECTORS)
        for (gi, gv), (wi, wv) in zip(got.sparse, want.sparse, strict=True):
            np.testing.assert_array_equal(gi, wi)
            np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-5)
        for g, w in zip(got.colbert, want.colbert, strict=True):
            np.testing.assert_allclose(g, w, **UNIT_VECTORS)


def test_unreachable_server_is_one_line(tmp_path: Path, corpus: Path) -> None:
    done = run_module(
        "bgem3_qdrant",
        "ingest",
        str(corpus),
        "--path",
        str(tmp_path / "s"),
        "--encoder-url",
        "http://127.0.0.1:9",
    )
    assert_clean_failure(done, 1, "cannot reach the encoder server at http://127.0.0.1:9", "bgem3 serve")


def test_eval_through_the_server(server_url: str, tmp_path: Path, tiny_checkpoint: Path) -> None:
    """`eval --encoder-url` ingests and scores through the server, importing no TensorFlow, with the
    figures a local encoder of the same checkpoint gives."""
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    docs = {
        "d1": "Feed the sourdough starter once a day with flour and water.",
        "d2": "Separated bike lanes follow the Seine in Paris.",
        "d3": "Windkraft an Land und auf See liefert den größten Anteil.",
    }
    (data / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in docs.items()), "utf-8"
    )
    queries = {"q1": "sourdough starter", "q2": "bike lanes", "q3": "Windkraft"}
    (data / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()), "utf-8"
    )
    (data / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\nq3\td3\t1\n", "utf-8"
    )
    figures = {}
    ways = {"server": ("--encoder-url", server_url), "local": ("--model", str(tiny_checkpoint))}
    for how, extra in ways.items():
        out = tmp_path / f"{how}.json"
        done, _ = run_cli(
            "eval", str(data), "-c", "kb", "--path", str(tmp_path / how), "--modes", "dense,sparse",
            "--json", str(out), *extra,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        if how == "server":
            assert not imported(done) & {"tensorflow", "keras", "torch", "transformers"}
        figures[how] = json.loads(out.read_text("utf-8"))["modes"]
    for mode in ("dense", "sparse"):
        for metric in ("ndcg@10", "recall@100", "mrr@10"):
            assert figures["server"][mode][metric] == pytest.approx(figures["local"][mode][metric], abs=1e-6)
