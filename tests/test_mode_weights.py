"""The combined score's default weights: one constant (the BAAI/bge-m3 model card's 0.4/0.2/0.4) that every
module reads, and FlagEmbedding's own compute_score default (1/1/1) named as such, checked against
FlagEmbedding itself."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS, FLAGEMBEDDING_WEIGHTS
from tests.optional import require_module
from tests.tolerances import APPROX

ROOT = Path(__file__).resolve().parents[1]
# The packages (their tests compare against FlagEmbedding with the weights written out, as a user would).
SOURCES = [ROOT / "bgem3_embeddings", *(p for p in (ROOT / "integrations").glob("*/*") if p.name != "tests")]
PAIRS = [("What is BGE M3?", "BGE M3 is an embedding model."), ("Defination of BM25", "BM25 ranks documents")]


def _weight_literals(path: Path) -> list[int]:
    """Lines of `path` holding a tuple or list literal of three numbers equal to the default weights."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Tuple | ast.List) and len(node.elts) == 3:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            numbers = len(values) == 3 and all(isinstance(v, int | float) for v in values)
            if numbers and tuple(float(v) for v in values) == DEFAULT_MODE_WEIGHTS:
                lines.append(node.lineno)
    return lines


def test_the_default_weights_are_written_once() -> None:
    found = {
        str(f.relative_to(ROOT)): lines
        for folder in SOURCES
        if folder.is_dir()
        for f in folder.rglob("*.py")
        if (lines := _weight_literals(f))
    }
    assert found == {"bgem3_embeddings/scoring.py": found.get("bgem3_embeddings/scoring.py", [])}, found
    assert len(found["bgem3_embeddings/scoring.py"]) == 1
    # and the comment beside it names where the numbers come from, not FlagEmbedding's default
    source = (ROOT / "bgem3_embeddings/scoring.py").read_text(encoding="utf-8")
    assert "BAAI/bge-m3 model card" in source


def test_every_default_reads_the_constant() -> None:
    from bgem3_embeddings.explain import cli
    from bgem3_embeddings.serve.schemas import ExplainRequest
    from bgem3_embeddings.verify import ReferenceNumbers

    assert cli.DEFAULT_WEIGHTS == "0.4,0.2,0.4"
    assert ExplainRequest(query="q", passage="p").weights_for_different_modes == list(DEFAULT_MODE_WEIGHTS)
    assert ReferenceNumbers().compute_score_weights is DEFAULT_MODE_WEIGHTS
    require_module("bgem3_qdrant")
    from bgem3_qdrant.evaluation import ModeSettings, modes

    assert modes.DEFAULT_WEIGHTS is DEFAULT_MODE_WEIGHTS
    assert ModeSettings().weights is DEFAULT_MODE_WEIGHTS
    require_module("starlette")
    from bgem3_qdrant.ui import session

    assert session.DEFAULT_WEIGHTS is DEFAULT_MODE_WEIGHTS


def test_flagembedding_default_is_one_one_one(tiny_encoder: Any, tiny_checkpoint: Path) -> None:
    """compute_score without weights is FlagEmbedding's own call without weights (1/1/1), not the card's."""
    from tests.flagembedding_ref import flagembedding_m3

    ref = flagembedding_m3(tiny_checkpoint).compute_score(PAIRS)["colbert+sparse+dense"]
    ours = tiny_encoder.compute_score(PAIRS)["colbert+sparse+dense"]
    assert ours == pytest.approx(ref, **APPROX)
    named = tiny_encoder.compute_score(PAIRS, weights_for_different_modes=FLAGEMBEDDING_WEIGHTS)
    assert named["colbert+sparse+dense"] == pytest.approx(ref, **APPROX)
    card = tiny_encoder.compute_score(PAIRS, weights_for_different_modes=DEFAULT_MODE_WEIGHTS)
    assert card["colbert+sparse+dense"] != pytest.approx(ref, **APPROX)  # the two weightings differ here
