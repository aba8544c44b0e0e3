"""Every ```python block of the README, docs/ and the integrations' READMEs runs as written
(tests/docs_blocks.py says how: a page's blocks in one session, in a fresh folder). BAAI/bge-m3 is the tiny
test checkpoint (BAAI/bge-reranker-v2-m3 the tiny reranker), filed under that name in a Hugging Face cache
with no hub behind it, so the blocks need no edit; blocks that talk to `bgem3 serve` get a tiny one. A new
page or block is picked up by itself. A block that cannot run here says why next to it (`<!-- not run by
tests/test_docs_python_blocks.py: REASON -->`) and shows up here as skipped, with that reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.docs_blocks import ROOT, SERVER_ENV, all_blocks

BLOCKS = all_blocks()
HUB_ID = "BAAI/bge-m3"
RERANKER_ID = "BAAI/bge-reranker-v2-m3"
RUN_TIMEOUT_S = 900


def hub_cache(cache: Path, repos: dict[str, Path]) -> Path:
    """A Hugging Face cache in which each hub id of `repos` is a local folder (a snapshot of links)."""
    commit = "0" * 40
    for hub_id, folder in repos.items():
        repo = cache / f"models--{hub_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for file in folder.iterdir():
            (snapshot / file.name).symlink_to(file)
    return cache


@contextmanager
def docs_server(checkpoint: Path, reranker_checkpoint: Path) -> Iterator[str]:
    """`bgem3 serve` with both models, named as the docs name them, in a thread of this process."""
    from bgem3_embeddings import BGEM3Encoder, BGEM3Reranker
    from bgem3_embeddings.serve.app import create_app
    from bgem3_embeddings.serve.server import serve_in_thread
    from bgem3_embeddings.serve.settings import ServeSettings

    encoder = BGEM3Encoder(checkpoint, precision="float32", device="cpu", show_progress=False)
    reranker = BGEM3Reranker(str(reranker_checkpoint), precision="float32", device="cpu", show_progress=False)
    app = create_app(encoder, ServeSettings(model_name=HUB_ID), reranker=reranker)
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture(scope="module")
def results(
    tiny_checkpoint: Path, tiny_reranker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """All blocks run once, in one process, beside a tiny `bgem3 serve`."""
    folder = tmp_path_factory.mktemp("docs-blocks")
    cache = hub_cache(folder / "hub", {HUB_ID: tiny_checkpoint, RERANKER_ID: tiny_reranker_checkpoint})
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        # no hub: the connection is refused at once and huggingface_hub takes the cached snapshot (offline
        # mode would also refuse the InferenceClient blocks' requests to the local server)
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HOME": str(folder),
        "BGEM3_WEIGHTS_CACHE": "off",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("QDRANT_URL", None)
    env.pop("HF_HUB_OFFLINE", None)
    out = folder / "results.json"
    with docs_server(tiny_checkpoint, tiny_reranker_checkpoint) as url:
        done = subprocess.run(
            [sys.executable, "-m", "tests.docs_blocks", str(out)],
            cwd=ROOT,
            env={**env, SERVER_ENV: url},
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return loaded


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs_as_written(block: Any, results: dict[str, Any]) -> None:
    if block.skip is not None:
        assert block.skip.strip(), f"{block.id}: an opt-out must say why"
        pytest.skip(f"{block.id}: {block.skip}")
    result = results[block.id]
    assert result["status"] == "passed", (
        f"{block.id} {result['status']}:\n{result.get('error') or result['reason']}"
    )


def test_every_page_with_python_is_found() -> None:
    pages = {str(b.path) for b in BLOCKS}
    assert {"README.md", "docs/langchain.md", "docs/serve.md"} <= pages, pages
