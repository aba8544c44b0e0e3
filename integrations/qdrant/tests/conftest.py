"""Fixtures for the Qdrant integration tests: a tiny BGE-M3 encoder, a small corpus, embedded stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant import open_store, resolve_target
from bgem3_qdrant.stores import BGEM3Store

# Distinct topics and vocabularies, Latin and Cyrillic scripts (the tiny tokenizer maps CJK to <unk>).
TEXTS = {
    "bread.txt": "Feed the sourdough starter once a day with equal weights of flour and water. "
    "Rye flour makes it lively, white flour makes it mild. Bake when it doubles within six hours.",
    "bikes.md": "# Cycling in Paris\n\nSeparated bike lanes follow the Seine and the rue de Rivoli. "
    "Shared electric bicycles stand in almost every district; in winter use lights and a reflective vest.",
    "energie.md": "Die Energiewende: Windkraft an Land und auf See liefert den größten Anteil, Photovoltaik "
    "folgt. Neue Stromtrassen und Batteriespeicher verbinden den windigen Norden mit dem Süden.",
    "volcano.txt": "На Камчатке около трёхсот вулканов, из них около тридцати действующих. Ключевская Сопка "
    "почти 4750 метров высотой; Долина гейзеров открыта в 1941 году.",
    "espresso.md": "Un espresso richiede sette grammi di caffè macinato fine, acqua a novanta gradi e nove "
    "bar di pressione; l'estrazione dura venticinque secondi e la crema è color nocciola.",
}
JSONL = [
    {
        "id": "q-1",
        "text": "Hybrid search mixes dense meaning with sparse exact words like product codes XJ-900.",
        "metadata": {"lang": "en", "topic": "search"},
    },
    {
        "id": "q-2",
        "text": "ColBERT compares each query token with every passage token and keeps the best match.",
        "metadata": {"lang": "en", "topic": "rerank"},
    },
    {
        "id": "q-3",
        "text": "Les vecteurs ColBERT servent seulement à reclasser une courte liste de candidats.",
        "metadata": {"lang": "fr", "topic": "rerank"},
    },
    {"text": "A record without an id is identified by its file and line number.", "metadata": {"lang": "en"}},
]


@pytest.fixture(scope="session")
def encoder(request: pytest.FixtureRequest, tiny_checkpoint: Path) -> Any:
    """The session's tiny encoder (the root `tiny_encoder` fixture when it exists)."""
    try:
        return request.getfixturevalue("tiny_encoder")
    except pytest.FixtureLookupError:
        from bgem3_embeddings import BGEM3Encoder

        return BGEM3Encoder(str(tiny_checkpoint))


def write_corpus(root: Path) -> Path:
    """The test corpus as files: five documents and a JSONL of four records."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in TEXTS.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "records.jsonl").write_text(
        "\n".join(json.dumps(r, ensure_ascii=False) for r in JSONL) + "\n", encoding="utf-8"
    )
    return root


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_corpus(tmp_path / "corpus")


@pytest.fixture(scope="session")
def long_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test corpus plus a document of several chunks (no two alike), written once."""
    root = write_corpus(tmp_path_factory.mktemp("long_corpus") / "corpus")
    parts = [f"Part {i}. {text}" for i, text in enumerate(TEXTS.values(), start=1)]
    (root / "long.txt").write_text(" ".join(parts), encoding="utf-8")
    return root


@pytest.fixture(params=["edge", "local"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BGEM3Store]:
    """A real embedded store in a temporary folder: Qdrant Edge (the default) and qdrant-client's local
    mode, so every behaviour is checked on both engines."""
    c = open_store(resolve_target(path=str(tmp_path / "qdrant_data"), engine=request.param))
    yield c
    c.close()
