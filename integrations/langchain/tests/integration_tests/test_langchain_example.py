"""examples/langchain_mac_rag.py end to end on the tiny checkpoint (context-only, no LLM)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from tests.optional import require_module, skip_or_fail

require_module("bgem3_qdrant")

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "langchain_mac_rag.py"


@pytest.fixture
def example() -> Any:
    if not EXAMPLE.exists():
        skip_or_fail(f"{EXAMPLE} not found (a checkout has it)")
    spec = importlib.util.spec_from_file_location("langchain_mac_rag_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mac_rag_example(example: Any, tmp_path: Path, tiny_checkpoint: Path, lc_encoder: Any,
                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "bge.md").write_text("What is BGE M3? A dense, sparse and multi-vector embedding model.")
    (notes / "sub" / "bio.txt").write_text("Photosynthesis converts sunlight, water and CO2 into sugar.")
    (notes / "skip.pdf").write_text("not a note")
    # Same settings as lc_encoder, so the example reuses the session's model instead of loading it again.
    monkeypatch.setenv("BGEM3_MODEL", str(tiny_checkpoint))
    monkeypatch.setenv("BGEM3_DEVICE", "cpu")
    store = str(tmp_path / "store")
    assert example.main([str(notes), "What is BGE M3?", "--store", store, "-k", "1", "--no-llm"]) == 0
    out = capsys.readouterr().out
    assert "[1] bge.md" in out and "Photosynthesis" not in out
    # A second run reuses the store (nothing re-encoded) and finds the other note.
    assert example.main([str(notes), "Photosynthesis converts sunlight", "--store", store, "-k", "1",
                         "--no-llm"]) == 0
    assert "[1] sub/bio.txt" in capsys.readouterr().out
