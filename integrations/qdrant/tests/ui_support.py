"""What the page tests share: a small store (the test corpus, documents holding HTML and script, a
collection of another model, texts whose offsets differ between Python and JavaScript in an unpooled, a
pooled and an IDF collection) and an --eval-dir with a synthetic evaluation report and two broken files."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target
from bgem3_qdrant.evaluation import EVAL_MODES
from bgem3_qdrant.evaluation.metrics import MEASURES
from bgem3_qdrant.evaluation.modes import ModeSettings
from bgem3_qdrant.evaluation.report import CollectionResult, EvalReport, ModeResult
from bgem3_qdrant.schema import CollectionSchema
from bgem3_qdrant.ui.app import create_ui_app
from bgem3_qdrant.ui.evals import EvalFolder
from bgem3_qdrant.ui.session import StoreSession

COLLECTION = "kb"
OTHER = "other-model"  # a collection another model wrote
XSS_SCRIPT = "Bread notes <script>window.__xss = 'script ran'</script> flour and water"
XSS_IMG = 'Starter notes <img src=x onerror="window.__xss = \'img ran\'"> rye flour'
XSS_RECORDS = [
    {"id": "xss-script", "text": XSS_SCRIPT, "metadata": {"lang": "xss"}},
    {"id": "xss-img", "text": XSS_IMG, "metadata": {"lang": "xss"}},
]
CHUNKING = IngestOptions(chunk_size=24, chunk_overlap=4, show_progress=False)
FOREIGN_RECORD = {
    "model": "BAAI/some-other-model",
    "fingerprint": "0" * 64,
    "precision": "float32",
    "vocab_size": 250002,
    "colbert_pooling": 1,
}


# Texts whose characters are not one UTF-16 unit and one code point each: emoji (a ZWJ sequence too), CJK
# Extension B ideographs and mathematical letters (two UTF-16 units per code point), combining marks (NFD:
# "e" + U+0301, one character of two code points), and ASCII. Searched with its own text as the query, each
# shares sparse terms with itself on the tiny checkpoint (its sparse weights are mostly zero), some after
# those characters. One chunk each.
UNICODE_TEXTS = {
    "emoji": "🐕🐕 dogs sleep; Feed the sourdough starter once a day with equal weights of flour and water. "
    "Rye flour makes it lively, white flour makes it mild. Bake when it doubles within six hours.",
    "emoji-zwj": "🐶🐕\u200d🦺 # Cycling in Paris. Separated bike lanes follow the Seine and the rue de "
    "Rivoli. Shared electric bicycles stand in almost every district; in winter use lights and a reflective "
    "vest.",
    "cjk-ext-b": "𠀋𠮷 # Cycling in Paris. Separated bike lanes follow the Seine and the rue de Rivoli. "
    "Shared electric bicycles stand in almost every district; in winter use lights and a reflective vest.",
    "math": "𝔘𝔫𝔦 A record without an id is identified by its file and line number.",
    "combining": unicodedata.normalize(
        "NFD",
        "Un espresso richiede sette grammi di caffè macinato fine, acqua a novanta gradi e nove bar di "
        "pressione; l'estrazione dura venticinque secondi e la crema è color nocciola.",
    ),
    "ascii": "Hybrid search mixes dense meaning with sparse exact words like product codes XJ-900.",
}
UNICODE = "unicode"  # the texts above, unpooled, reference sparse scores
POOLED = "unicode-pooled"  # the same, ColBERT rows pooled by 2
IDF = "unicode-idf"  # the same, sparse vector with Qdrant's IDF modifier
ONE_CHUNK = IngestOptions(chunk_size=200, chunk_overlap=0, show_progress=False)


def build_store(root: Path, corpus: Path, encoder: Any) -> tuple[Path, int]:
    """A Qdrant Edge store with the test corpus and the XSS documents in `kb` (its path and chunk count),
    `other-model`, a collection whose record names another model, and the Unicode texts in `unicode`,
    `unicode-pooled` and `unicode-idf`."""
    root.mkdir(parents=True, exist_ok=True)
    xss = root / "xss.jsonl"
    xss.write_text("".join(json.dumps(r) + "\n" for r in XSS_RECORDS), encoding="utf-8")
    texts = root / "unicode.jsonl"
    records = [{"id": k, "text": t, "metadata": {"script": k}} for k, t in UNICODE_TEXTS.items()]
    texts.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    idf = CollectionSchema(size=encoder.hidden_size, sparse_modifier="idf")
    path = root / "store"
    with open_store(resolve_target(path=str(path))) as store:
        # The corpus without long.txt: its parts repeat the other documents, and chunks of equal text tie.
        kb = Ingestor(store, COLLECTION, encoder, options=CHUNKING)
        chunks = kb.ingest_paths([corpus, xss], exclude=["long.txt"]).chunks
        Ingestor(store, OTHER, encoder, options=CHUNKING).ingest_paths([corpus / "bread.txt"])
        store.write_model_record(OTHER, FOREIGN_RECORD)
        Ingestor(store, UNICODE, encoder, options=ONE_CHUNK).ingest_paths([texts])
        pooled = IngestOptions(chunk_size=200, chunk_overlap=0, show_progress=False, colbert_pooling=2)
        Ingestor(store, POOLED, encoder, options=pooled).ingest_paths([texts])
        Ingestor(store, IDF, encoder, schema=idf, options=ONE_CHUNK).ingest_paths([texts])
    return path, chunks


# The report the Evaluation tab is tested (and docs/images/explain-eval.png taken) with holds figures made up
# by a formula, not measured: its names say so, and name no real model or data set.
SYNTHETIC = "synthetic example (made-up figures)"
EVAL_FILE = "synthetic-example.json"
EVAL_COLLECTIONS = ("synthetic-a", "synthetic-b-pool2")


def eval_report(collections: tuple[str, ...] = EVAL_COLLECTIONS) -> dict[str, Any]:
    """The shape `bgem3-qdrant eval --json` writes for two collections (report.py's own to_json), with
    made-up figures labelled as such."""
    results = []
    for k, name in enumerate(collections):
        modes = {
            mode: ModeResult(
                mode,
                per_query={m: {f"q{q}": round(0.3 + 0.08 * i + 0.05 * j - 0.04 * k + 0.01 * q * (k + q), 4)
                               for q in range(3)} for j, m in enumerate(MEASURES)},  # fmt: skip
                latency_ms=[4.0 + i, 5.0 + i],
            )
            for i, mode in enumerate(EVAL_MODES)
        }
        disk = 3000 * (150_000 - 70_000 * k)  # bytes of 3,000 chunks, the second pooled by 2
        results.append(CollectionResult(name, 3000, "float16", 1 + k, disk, modes))
    report = EvalReport(SYNTHETIC, "none", "none (made-up figures)", "no store (made-up figures)", 3, 3,
                        ModeSettings(), False, 1.0, results)  # fmt: skip
    return report.to_json()


def write_eval_dir(root: Path) -> Path:
    """A report (made-up figures), a truncated JSON and a JSON that is no report."""
    root.mkdir(parents=True, exist_ok=True)
    (root / EVAL_FILE).write_text(json.dumps(eval_report(), indent=2), encoding="utf-8")
    (root / "broken.json").write_text('{"dataset": "x", "modes": {', encoding="utf-8")
    (root / "notes.json").write_text('{"hello": "not a report"}', encoding="utf-8")
    return root


def session_for(path: Path, encoder: Any) -> StoreSession:
    return StoreSession(resolve_target(path=str(path)), encoder)


@contextmanager
def served(session: StoreSession, evals: Path | None, api_key: str | None = None) -> Iterator[str]:
    """The page's app on loopback in a thread (the command's app, without its encoder loading)."""
    from bgem3_embeddings.serve.server import serve_in_thread

    app = create_ui_app(session, EvalFolder(evals), api_key=api_key)
    with serve_in_thread(app) as url:
        yield url
