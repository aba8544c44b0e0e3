"""What the page tests share: a small store (the test corpus, documents holding HTML and script, a
collection of another model) and an --eval-dir with a real evaluation report and two broken files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target
from bgem3_qdrant.evaluation import EVAL_MODES
from bgem3_qdrant.evaluation.metrics import MEASURES
from bgem3_qdrant.evaluation.modes import ModeSettings
from bgem3_qdrant.evaluation.report import CollectionResult, EvalReport, ModeResult
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


def build_store(root: Path, corpus: Path, encoder: Any) -> tuple[Path, int]:
    """A Qdrant Edge store with the test corpus and the XSS documents in `kb` (its path and chunk count),
    and `other-model`, a collection whose record names another model."""
    root.mkdir(parents=True, exist_ok=True)
    xss = root / "xss.jsonl"
    xss.write_text("".join(json.dumps(r) + "\n" for r in XSS_RECORDS), encoding="utf-8")
    path = root / "store"
    with open_store(resolve_target(path=str(path))) as store:
        # The corpus without long.txt: its parts repeat the other documents, and chunks of equal text tie.
        kb = Ingestor(store, COLLECTION, encoder, options=CHUNKING)
        chunks = kb.ingest_paths([corpus, xss], exclude=["long.txt"]).chunks
        Ingestor(store, OTHER, encoder, options=CHUNKING).ingest_paths([corpus / "bread.txt"])
        store.write_model_record(OTHER, FOREIGN_RECORD)
    return path, chunks


def eval_report(collections: tuple[str, ...] = ("scifact-f16", "scifact-pool2")) -> dict[str, Any]:
    """What `bgem3-qdrant eval --json` writes for two collections (report.py's own to_json)."""
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
    report = EvalReport("scifact", "test", "BAAI/bge-m3", "Qdrant Edge store at ./eval", 3, 3,
                        ModeSettings(), False, 1.0, results)  # fmt: skip
    return report.to_json()


def write_eval_dir(root: Path) -> Path:
    """A real report, a truncated JSON and a JSON that is no report."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "scifact.json").write_text(json.dumps(eval_report(), indent=2), encoding="utf-8")
    (root / "broken.json").write_text('{"dataset": "scifact", "modes": {', encoding="utf-8")
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
