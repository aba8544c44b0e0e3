"""`bgem3-qdrant ui`: time from pressing Enter to all four modes' hits drawn, on a 3,000-chunk collection.

    python benchmarks/qdrant_ui_page.py [--model DIR] [--chunks 3000] [--queries 30] [--limit 10]

The page itself measures it (performance.now() from the Enter key's event to the frame after the four
columns are in the DOM) and keeps the figures on the results element, beside the server's own: the query
embedding plus the four searches (what `bgem3-qdrant search` would spend, "search"), and the highlighting
of the hits' sparse terms. The target: page time <= search time + 100 ms.

The page runs as a user runs it (`bgem3-qdrant ui` in its own process), in headless Debian chromium driven
by Selenium. Without --model the checkpoint is a generated one of BGE-M3's width with one layer
(benchmarks/qdrant_eval.py's): 1024-d dense and ColBERT vectors, so the store's work per search is the real
one, while the query encodes fast. The collection is written directly with synthetic vectors of those sizes
(ingesting 3,000 chunks would be minutes of encoding that this measure does not need): chunk texts of about
2,000 characters (a 512-token chunk of English text), `--rows` ColBERT rows each, and sparse weights on the
text's own token ids, so a query's words are highlighted in the hits they occur in. Queries are six words of a
chunk. The model record is the checkpoint's, so the page's model check passes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_eval import SYLLABLES

COLLECTION = "bench"
PHASES = ("client_ms", "request_ms", "render_ms", "server_ms", "searched_ms", "highlight_ms")
READ_FIGURES = "return Object.assign({}, document.getElementById('results').dataset)"
DATASET = {k: re.sub(r"_(\w)", lambda m: m.group(1).upper(), k) for k in PHASES}  # client_ms -> clientMs


def words(rng: np.random.Generator, n: int = 6000) -> list[str]:
    return sorted({"".join(rng.choice(SYLLABLES, size=int(rng.integers(2, 4)))) for _ in range(n)})


def corpus(chunks: int, seed: int = 0) -> list[str]:
    """Chunk texts of 260-340 pseudo-words (about 2,000 characters, a 512-token chunk of English)."""
    rng = np.random.default_rng(seed)
    vocab = words(rng)
    return [" ".join(rng.choice(vocab, size=int(rng.integers(260, 340)))) for _ in range(chunks)]


def bench_checkpoint(out: Path, texts: list[str]) -> Path:
    """BGE-M3's width (1024 hidden, 16 heads, FFN 4096) with one layer, and a tokenizer trained on the
    corpus with 8,000 pieces, so a pseudo-word is a token or two as an English word is for BGE-M3 (the test
    tokenizer would cut it into letters, and every letter of a query would match hundreds of times)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import tiny_checkpoint as tc

    if not (out / "config.json").is_file():
        train = tc.train_sentencepiece
        tc.SIZES["wide"] = {**tc.SIZES["full"], "num_hidden_layers": 1}
        tc.SAMPLE_TEXT = texts[:1500]  # type: ignore[misc]
        tc.train_sentencepiece = lambda path, vocab_size=8000: train(path, vocab_size)  # type: ignore[misc]
        tc.make_tiny_checkpoint(out, size="wide", seed=0)  # type: ignore[arg-type]
    return out


def write_collection(path: Path, model: str, texts: list[str], rows: int, seed: int = 0) -> None:
    """The store with one synthetic point per text."""
    from bgem3_qdrant import open_store, resolve_target
    from bgem3_qdrant.encoder import load_encoder
    from bgem3_qdrant.identity import identity_of
    from bgem3_qdrant.ingest.writer import ensure_payload_indexes
    from bgem3_qdrant.payload import chunk_payload
    from bgem3_qdrant.schema import CollectionSchema
    from bgem3_qdrant.stores.base import StoredPoint

    encoder: Any = load_encoder(model, precision="float32", device="cpu")
    dim = int(encoder.hidden_size)
    rng = np.random.default_rng(seed)
    chunks = len(texts)
    identity = identity_of(encoder, model)
    with open_store(resolve_target(path=str(path))) as store:
        store.create_collection(COLLECTION, CollectionSchema(size=dim))
        for start in range(0, chunks, 64):
            batch = texts[start : start + 64]
            ids = encoder.tokenizer.encode_batch(batch, 8192)
            points = []
            for k, (text, token_ids) in enumerate(zip(batch, ids, strict=True)):
                i = start + k
                unit = rng.standard_normal((rows + 1, dim)).astype(np.float32)
                unit /= np.linalg.norm(unit, axis=1, keepdims=True)
                sparse_ids = np.unique(np.asarray(token_ids[1:-1], dtype=np.int64))
                sparse = (sparse_ids, rng.random(len(sparse_ids), dtype=np.float32) * 0.3)
                payload = chunk_payload(
                    text=text, source=f"doc-{i // 4}.txt", doc_id=f"doc-{i // 4}", chunk_index=i % 4,
                    chunk_count=4, char_start=0, char_end=len(text), n_tokens=len(token_ids),
                    content_hash=str(i), model=model, metadata={"lang": ("en", "de", "fr")[i % 3]},
                )  # fmt: skip
                vectors = {"dense": unit[0], "colbert": unit[1:], "sparse": sparse}
                points.append(StoredPoint(str(uuid.UUID(int=i + 1)), payload, vectors))
            store.upsert(COLLECTION, points)
        ensure_payload_indexes(store, COLLECTION, {"lang": "keyword"})
        store.optimize(COLLECTION)
        assert identity is not None
        store.write_model_record(COLLECTION, identity.to_dict())


def start_page(store: Path, model: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bgem3_qdrant", "ui", "--path", str(store), "--model", model, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/", line)
    if not found:
        proc.kill()
        raise SystemExit(f"the page did not start: {line}{proc.stderr.read() if proc.stderr else ''}")
    return proc, found.group(0)


def browser(profile: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1440,1000",
                 f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))


def drawn(driver: Any) -> str | None:
    """The query whose hits the page has drawn last."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, "results").get_attribute("data-query")


def measure(url: str, queries: list[str], limit: int, warmup: int) -> list[dict[str, float]]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with tempfile.TemporaryDirectory() as profile:
        driver = browser(profile)
        try:
            driver.get(url)
            wait = WebDriverWait(driver, 120)
            wait.until(lambda d: d.find_element(By.ID, "collection").get_attribute("value") == COLLECTION)
            Select(driver.find_element(By.ID, "limit")).select_by_value(str(limit))
            box = driver.find_element(By.ID, "query")
            figures = []
            for n, query in enumerate(queries):
                box.clear()
                box.send_keys(query)
                box.send_keys(Keys.ENTER)
                wait.until(lambda d, q=query: drawn(d) == q)
                data = driver.execute_script(READ_FIGURES)
                hits = len(driver.find_elements(By.CSS_SELECTOR, ".hit"))
                marks = len(driver.find_elements(By.CSS_SELECTOR, ".hit mark.term"))
                if n >= warmup:
                    row = {k: float(data[DATASET[k]]) for k in PHASES}
                    row.update(hits=hits, marks=marks, over_search_ms=row["client_ms"] - row["searched_ms"])
                    figures.append(row)
            return figures
        finally:
            driver.quit()


def summary(figures: list[dict[str, float]]) -> dict[str, Any]:
    """p50 and p95 of every phase, and the share of searches within the target."""

    def stat(key: str) -> dict[str, float]:
        values = sorted(f[key] for f in figures)
        p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
        return {"p50": statistics.median(values), "p95": p95}

    out: dict[str, Any] = {k: stat(k) for k in (*PHASES, "over_search_ms")}
    out["hits_per_search"] = statistics.median(f["hits"] for f in figures)
    out["highlighted_terms_per_search"] = statistics.median(f["marks"] for f in figures)
    out["within_target"] = sum(f["over_search_ms"] <= 100 for f in figures) / len(figures)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="Checkpoint folder (default: a generated 1-layer 1024-d one).")
    ap.add_argument("--chunks", type=int, default=3000)
    ap.add_argument("--rows", type=int, default=128, help="ColBERT rows per chunk.")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="Searches not counted (graph tracing, caches).")
    ap.add_argument("--limit", type=int, default=10, help="Hits per mode (the page's choices: 5 10 20 50).")
    ap.add_argument("--workdir", default="bench-ui")
    ap.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    texts = corpus(args.chunks)
    model = args.model or str(bench_checkpoint(work / "checkpoint", texts))
    store = work / f"store-{args.chunks}x{args.rows}"
    if not store.is_dir():
        t0 = time.perf_counter()
        write_collection(store, model, texts, args.rows)
        sys.stderr.write(f"wrote {args.chunks} chunks in {time.perf_counter() - t0:.0f} s\n")
    rng = np.random.default_rng(1)
    picks = rng.choice(len(texts), size=args.warmup + args.queries, replace=False)
    queries = [" ".join(rng.choice(texts[int(i)].split(), size=6, replace=False)) for i in picks]

    from bgem3_qdrant.tools.bench_store import cpu_model

    proc, url = start_page(store, model)
    try:
        figures = measure(url, queries, args.limit, args.warmup)
    finally:
        proc.terminate()
        proc.wait(30)
    chromium = subprocess.run(["/usr/bin/chromium", "--version"], capture_output=True, text=True).stdout
    chromium = chromium.strip()
    report = {
        "cpu": cpu_model(),
        "browser": chromium,
        "chunks": args.chunks,
        "colbert_rows": args.rows,
        "hits_per_mode": args.limit,
        "queries": args.queries,
        "model": model,
        **summary(figures),
    }
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    sys.stdout.write(
        f"{report['chunks']} chunks ({report['colbert_rows']} ColBERT rows each), {args.limit} hits per "
        f"mode, {args.queries} queries after {args.warmup} warm-up ones; {report['cpu']}; {chromium}\n"
    )
    rows = [
        ("Enter -> four modes drawn (page)", "client_ms"),
        ("  request sent -> answer parsed", "request_ms"),
        ("  answer -> DOM built", "render_ms"),
        ("server: whole request", "server_ms"),
        ("server: query embedding + 4 searches", "searched_ms"),
        ("server: highlighting sparse terms", "highlight_ms"),
        ("page - search (target <= 100)", "over_search_ms"),
    ]
    sys.stdout.write(f"{'figure':<40}{'p50 ms':>10}{'p95 ms':>10}\n")
    for label, key in rows:
        sys.stdout.write(f"{label:<40}{report[key]['p50']:>10.1f}{report[key]['p95']:>10.1f}\n")
    sys.stdout.write(
        f"searches within search + 100 ms: {100 * report['within_target']:.0f}%; hits drawn per search "
        f"{report['hits_per_search']:.0f}, highlighted terms {report['highlighted_terms_per_search']:.0f}\n"
    )


if __name__ == "__main__":
    main()
