"""Retrieval metrics from pytrec_eval (trec_eval's own C code), never our own formulas.

trec_eval's conventions hold because trec_eval computes them: linear gain (a grade-2 document counts
twice a grade-1 one) with a log2 discount for nDCG, a run re-sorted by score with ties broken by document
id in descending order, qrels grades <= 0 not relevant. Two choices are ours, both stated in
docs/evaluation.md:

- MRR@10 is trec_eval's `recip_rank` on the run cut to its first 10 documents in trec_eval's order
  (trec_eval's `recip_rank` has no cut-off).
- Every judged query counts, so modes and collections are averaged over the same queries: a query the
  run has no document for (a sparse search that matches no token) scores 0 on every measure, as
  trec_eval -c and ir-measures count it; pytrec_eval alone would leave it out of the mean. A judged query
  without any relevant document scores what trec_eval gives it (0 on all three measures).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bgem3_embeddings.install_hint import pip_install

# Our names -> trec_eval's measure and the run depth it is computed on (None: the whole run).
MEASURES: dict[str, tuple[str, int | None]] = {
    "ndcg@10": ("ndcg_cut_10", None),
    "recall@100": ("recall_100", None),
    "mrr@10": ("recip_rank", 10),
}
Run = Mapping[str, Mapping[str, float]]  # query id -> {document id: score}
Qrels = Mapping[str, Mapping[str, int]]


def import_pytrec_eval() -> object:
    """pytrec_eval, or an ImportError naming the extra that installs it."""
    try:
        import pytrec_eval
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "bgem3-qdrant eval needs pytrec_eval (the eval extra), not installed: run "
            f"{pip_install('bgem3-qdrant[eval]')} (or {pip_install('pytrec-eval-terrier')})"
        ) from e
    return pytrec_eval


def trec_order(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """A query's documents in trec_eval's order: score descending, ties by document id descending."""
    return sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)


def cut(run: Run, depth: int) -> dict[str, dict[str, float]]:
    """Each query's first `depth` documents in trec_eval's order."""
    return {q: dict(trec_order(docs)[:depth]) for q, docs in run.items()}


def per_query(qrels: Qrels, run: Run) -> dict[str, dict[str, float]]:
    """measure -> {query id: value} for every judged query (0 where the run has no document for it)."""
    pytrec_eval = import_pytrec_eval()
    judged = {q: dict(docs) for q, docs in qrels.items()}
    out: dict[str, dict[str, float]] = {name: dict.fromkeys(judged, 0.0) for name in MEASURES}
    for name, (measure, depth) in MEASURES.items():
        ranked = {q: dict(docs) for q, docs in (cut(run, depth) if depth else run).items() if docs}
        evaluator = pytrec_eval.RelevanceEvaluator(judged, {measure})  # type: ignore[attr-defined]
        for q, values in evaluator.evaluate(ranked).items():
            out[name][q] = float(values[measure])
    return out


def mean(values: Mapping[str, float]) -> float:
    return float(np.mean(list(values.values()))) if values else 0.0
