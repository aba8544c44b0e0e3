"""How close an exported model is to the Keras float32 model: sizes, dense cosine, ColBERT and lexical scores.

    python -m bgem3_embeddings.export.quality --model CHECKPOINT [--quantize float16 int8] [--saved-model]
        [--keep DIR]

Exports each requested variant into a temporary folder (or DIR), runs it and the Keras model on the same
padded batches of sample queries and passages, and prints one row per variant.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.batching import pad_batch
from bgem3_embeddings.model import OUTPUT_NAMES
from bgem3_embeddings.outputs import colbert_vecs_from_batch, lexical_weights_from_batch
from bgem3_embeddings.scoring import colbert_score, lexical_matching_score

logger = logging.getLogger(__name__)

Runner = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]

QUERIES = [
    "What is BGE M3?",
    "Defination of BM25",
    "How do search engines rank documents?",
    "Quelle est la capitale de la France ?",
]
PASSAGES = [
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms "
    "appearing in each document",
    "A search engine returns the documents most relevant to the question of its user, ordered by a score "
    "that mixes term statistics, links and learned relevance signals.",
    "Paris est la capitale et la plus grande ville de France.",
    "The weather today is sunny with a light breeze from the west, and tomorrow it will rain.",
]


@dataclass
class QualityReport:
    """One exported variant against the Keras float32 model (differences are absolute, worst case)."""

    variant: str
    size_bytes: int
    dense_cosine_min: float
    dense_cosine_mean: float
    colbert_vec_cosine_min: float
    colbert_score_max_diff: float
    sparse_weight_max_diff: float
    lexical_score_max_diff: float
    seconds: float  # time of the variant's forward passes here (after one warm-up call)


def _cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = np.sum(a * b, axis=-1)
    den = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return num / np.maximum(den, 1e-12)


def _per_text(out: dict[str, np.ndarray], ids: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    return {
        "dense": out["dense_vecs"],
        "lexical": lexical_weights_from_batch(out["sparse_weights"], ids),
        "colbert": colbert_vecs_from_batch(out["colbert_vecs"], mask),
    }


def compare(reference: Runner, candidate: Runner, token_ids: dict[str, list[list[int]]], pad_id: int,
            variant: str = "", size_bytes: int = 0) -> QualityReport:
    """Run both on each group of texts (one padded batch per group) and measure the differences."""
    ref_texts: dict[str, Any] = {}
    cand_texts: dict[str, Any] = {}
    cosines, colbert_cos, sparse_diff = [], [], 0.0
    seconds = 0.0
    for group, ids_list in token_ids.items():
        ids, mask = pad_batch(ids_list, pad_id)
        ref = reference(ids, mask)
        candidate(ids, mask)  # warm-up: first call allocates tensors for this shape
        start = time.perf_counter()
        cand = candidate(ids, mask)
        seconds += time.perf_counter() - start
        cosines.append(_cosine_rows(ref["dense_vecs"], cand["dense_vecs"]))
        real = mask[:, 1:].astype(bool)
        colbert_cos.append(_cosine_rows(ref["colbert_vecs"], cand["colbert_vecs"])[real])
        sparse_diff = max(sparse_diff, float(np.max(np.abs(ref["sparse_weights"] - cand["sparse_weights"]))))
        ref_texts[group] = _per_text(ref, ids, mask)
        cand_texts[group] = _per_text(cand, ids, mask)
    colbert_diff, lexical_diff = 0.0, 0.0
    groups = list(token_ids)
    # Scores between the first group (queries) and the last (passages), every pair.
    q, p = groups[0], groups[-1]
    for i in range(len(token_ids[q])):
        for j in range(len(token_ids[p])):
            c_ref = colbert_score(ref_texts[q]["colbert"][i], ref_texts[p]["colbert"][j])
            c_cand = colbert_score(cand_texts[q]["colbert"][i], cand_texts[p]["colbert"][j])
            colbert_diff = max(colbert_diff, abs(c_ref - c_cand))
            l_ref = lexical_matching_score(ref_texts[q]["lexical"][i], ref_texts[p]["lexical"][j])
            l_cand = lexical_matching_score(cand_texts[q]["lexical"][i], cand_texts[p]["lexical"][j])
            lexical_diff = max(lexical_diff, abs(l_ref - l_cand))
    all_cos = np.concatenate(cosines)
    return QualityReport(
        variant=variant,
        size_bytes=size_bytes,
        dense_cosine_min=float(all_cos.min()),
        dense_cosine_mean=float(all_cos.mean()),
        colbert_vec_cosine_min=float(np.concatenate(colbert_cos).min()),
        colbert_score_max_diff=colbert_diff,
        sparse_weight_max_diff=sparse_diff,
        lexical_score_max_diff=lexical_diff,
        seconds=seconds,
    )


def keras_runner(encoder: Any) -> Runner:
    """The encoder's own compiled inference function, all three outputs."""
    return lambda ids, mask: encoder.run_batch(ids, mask, OUTPUT_NAMES)


def saved_model_runner(path: str | Path) -> Runner:
    """serving_default of a SavedModel, loaded with plain tf.saved_model.load."""
    import tensorflow as tf

    fn = tf.saved_model.load(str(path)).signatures["serving_default"]

    def run(ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        out = fn(input_ids=tf.constant(ids, tf.int32), attention_mask=tf.constant(mask, tf.int32))
        return {k: v.numpy() for k, v in out.items()}

    return run


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def sample_token_ids(encoder: Any, queries: Sequence[str] = QUERIES, passages: Sequence[str] = PASSAGES,
                     max_length: int = 512) -> dict[str, list[list[int]]]:
    return {"queries": encoder.tokenize(list(queries), max_length),
            "passages": encoder.tokenize(list(passages), max_length)}


def measure(encoder: Any, variants: Sequence[str], work_dir: Path) -> list[QualityReport]:
    """Export each variant ("saved_model" or a tflite quantize value) under work_dir and compare it."""
    from bgem3_embeddings.export.saved_model import export_saved_model
    from bgem3_embeddings.export.tflite import MODEL_FILE, export_tflite, load_tflite

    token_ids = sample_token_ids(encoder)
    reference = keras_runner(encoder)
    reports = []
    for variant in variants:
        out = work_dir / variant
        start = time.perf_counter()
        if variant == "saved_model":
            export_saved_model(encoder, out)
            runner, size = saved_model_runner(out), folder_size(out / "variables")
            name = f"saved_model ({encoder.precision})"
        else:
            export_tflite(encoder, out, quantize=variant)
            runner, size = load_tflite(out), (out / MODEL_FILE).stat().st_size
            name = f"tflite {variant}"
        logger.info("exported %s in %.0f s", name, time.perf_counter() - start)
        reports.append(compare(reference, runner, token_ids, encoder.tokenizer.pad_token_id, name, size))
        del runner
    return reports


def format_reports(reports: Sequence[QualityReport]) -> str:
    """A Markdown table, one row per variant."""
    head = ("| variant | size (MB) | dense cosine min / mean | colbert vec cosine min "
            "| colbert score max diff | sparse weight max diff | lexical score max diff |")
    rows = [head, "|" + " --- |" * 7]
    for r in reports:
        rows.append(f"| {r.variant} | {r.size_bytes / 1e6:.1f} "
                    f"| {r.dense_cosine_min:.6f} / {r.dense_cosine_mean:.6f} "
                    f"| {r.colbert_vec_cosine_min:.6f} | {r.colbert_score_max_diff:.2e} "
                    f"| {r.sparse_weight_max_diff:.2e} | {r.lexical_score_max_diff:.2e} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Measure exported models against the Keras float32 model.")
    parser.add_argument("--model", required=True, help="hub id or checkpoint folder")
    parser.add_argument("--quantize", nargs="*", default=["float16", "int8"], help="tflite variants")
    parser.add_argument("--saved-model", action="store_true", help="also compare the SavedModel")
    parser.add_argument("--keep", type=Path, help="keep the exports in this new folder")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from bgem3_embeddings.encoder import BGEM3Encoder

    encoder = BGEM3Encoder(args.model, precision="float32", device="cpu")
    variants = (["saved_model"] if args.saved_model else []) + list(args.quantize)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=False)
        reports = measure(encoder, variants, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            reports = measure(encoder, variants, Path(tmp))
    if args.json:
        import json

        print(json.dumps([asdict(r) for r in reports], indent=2))
    else:
        print(format_reports(reports))


if __name__ == "__main__":
    main()
