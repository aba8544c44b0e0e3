"""examples/llama_index_hybrid.py runs end to end on the tiny checkpoint, in each rerank mode."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.install_forms import clone_pip_install
from tests.optional import require_module

require_module("llama_index.vector_stores.qdrant")

from llama_index.embeddings.bgem3 import BGEM3Embedding  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "llama_index_hybrid.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llama_index_hybrid_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def shared_model(example: ModuleType, tiny_encoder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the example loads BGEM3_MODEL; reuse the session's tiny encoder instead of loading it again
    monkeypatch.setattr(example, "load_embedding", lambda model: BGEM3Embedding(encoder=tiny_encoder))


@pytest.mark.usefixtures("shared_model")
def test_example_modes_return_the_exact_text_first(example: ModuleType, tmp_path: Path) -> None:
    query = example.DOCS[3]
    modes = ["none", "colbert"]
    if importlib.util.find_spec("bgem3_qdrant") is not None:
        modes.append("qdrant")
    results = {
        m: example.main([query, "--rerank", m, "--top-k", "3", "--path", str(tmp_path / m)]) for m in modes
    }
    for m, hits in results.items():
        assert hits[0].node.get_content() == query, m
    if "qdrant" in results:
        # Qdrant's MAX_SIM rerank on Qdrant Edge and the LlamaIndex postprocessor agree on the ColBERT
        # scores, up to the default float16 storage of the ColBERT vectors (unit rows: about 1e-3).
        by_text = {b.node.get_content(): b.score for b in results["colbert"]}
        for a in results["qdrant"]:
            assert a.score == pytest.approx(by_text[a.node.get_content()], abs=2e-3)


@pytest.mark.usefixtures("shared_model")
def test_example_without_bgem3_qdrant_names_the_install(
    example: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bgem3_qdrant", None)
    with pytest.raises(ImportError, match=re.escape(clone_pip_install("integrations/qdrant"))):
        example.main(["q", "--rerank", "qdrant", "--path", str(tmp_path / "q")])
