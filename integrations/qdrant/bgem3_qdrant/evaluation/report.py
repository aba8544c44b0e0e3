"""What an evaluation measured, as tables (one row per mode; collections side by side) and as JSON."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..wording import counted
from .metrics import MEASURES, mean
from .modes import ModeSettings
from .significance import ALPHA, TEST_NAME, beyond_chance, sign_flip_p

# Column titles of the measures, in MEASURES order.
TITLES = {"ndcg@10": "nDCG@10", "recall@100": "Recall@100", "mrr@10": "MRR@10"}
PAIRED = "ndcg@10"  # the measure compared query by query between collections
# Longer collection names are shown by their number in the compare tables (which then fit 100 columns).
MAX_NAME_COLUMN = 30
TABLE_COLUMNS = 100


def _wrap(text: str) -> list[str]:
    """A sentence of the report in lines of at most TABLE_COLUMNS (names and paths kept whole)."""
    return textwrap.wrap(
        text, TABLE_COLUMNS, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )


@dataclass
class ModeResult:
    """One mode on one collection: per-query measures and search latencies."""

    mode: str
    per_query: dict[str, dict[str, float]]  # measure -> {query id: value}
    latency_ms: list[float]
    run: dict[str, dict[str, float]] = field(default_factory=dict)  # query id -> {document id: score}

    def mean(self, measure: str) -> float:
        return mean(self.per_query[measure])

    def latency(self, q: float) -> float:
        return float(np.percentile(self.latency_ms, q)) if self.latency_ms else 0.0

    @property
    def queries_per_s(self) -> float:
        total = sum(self.latency_ms) / 1000
        return len(self.latency_ms) / total if total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            **{m: self.mean(m) for m in MEASURES},
            "latency_ms": {"p50": self.latency(50), "p95": self.latency(95)},
            "queries_per_s": self.queries_per_s,
        }


@dataclass
class CollectionResult:
    """Every mode on one collection, and what the collection holds."""

    collection: str
    chunks: int
    colbert_dtype: str
    colbert_pooling: int
    disk_bytes: int | None  # None: not visible from here (a server)
    modes: dict[str, ModeResult] = field(default_factory=dict)
    ingested: str | None = None  # the ingest summary line, when the evaluation ingested the corpus

    @property
    def bytes_per_chunk(self) -> float | None:
        return self.disk_bytes / self.chunks if self.disk_bytes is not None and self.chunks else None

    def describe(self) -> str:
        size = (
            f"{self.bytes_per_chunk / 1024:.1f} KiB on disk per chunk"
            if self.bytes_per_chunk is not None
            else "bytes on disk not visible (a server)"
        )
        pooling = f"pooled by {self.colbert_pooling}" if self.colbert_pooling > 1 else "unpooled"
        chunks = counted(self.chunks, "chunk")
        return f"{self.collection!r}: {chunks}, ColBERT {self.colbert_dtype} {pooling}, {size}"

    def to_json(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "chunks": self.chunks,
            "colbert_dtype": self.colbert_dtype,
            "colbert_pooling": self.colbert_pooling,
            "modes": {m: r.to_json() for m, r in self.modes.items()},
            "bytes_per_chunk": self.bytes_per_chunk,
        }


@dataclass
class Paired:
    """Per-query differences of one measure, B minus A, over the same queries."""

    diffs: np.ndarray

    @property
    def mean(self) -> float:
        return float(self.diffs.mean()) if len(self.diffs) else 0.0

    def ci95(self) -> tuple[float, float]:
        """Student's t interval of the mean difference (the paired t-test's)."""
        from scipy import stats

        n = len(self.diffs)
        if n < 2:
            return (self.mean, self.mean)
        half = float(stats.t.ppf(0.975, n - 1) * self.diffs.std(ddof=1) / math.sqrt(n))
        return (self.mean - half, self.mean + half)

    def p_value(self) -> float:
        """Two-sided paired sign-flip permutation test (significance.py): 1.0 when every query ties."""
        return sign_flip_p(self.diffs)

    def wins_ties_losses(self, eps: float = 1e-9) -> tuple[int, int, int]:
        return (
            int(np.sum(self.diffs > eps)),
            int(np.sum(np.abs(self.diffs) <= eps)),
            int(np.sum(self.diffs < -eps)),
        )

    def to_json(self) -> dict[str, Any]:
        w, t, lo = self.wins_ties_losses()
        p = self.p_value()
        return {"mean_diff": self.mean, "ci95": list(self.ci95()), "p_value": p, "test": TEST_NAME,
                "beyond_chance": beyond_chance(p), "alpha": ALPHA,
                "wins": w, "ties": t, "losses": lo}  # fmt: skip


def paired(a: ModeResult, b: ModeResult, measure: str = PAIRED) -> Paired:
    qids = sorted(a.per_query[measure])
    return Paired(np.asarray([b.per_query[measure][q] - a.per_query[measure][q] for q in qids]))


@dataclass
class EvalReport:
    """An evaluation of one or more collections of the same corpus, the first one the baseline."""

    dataset: str
    split: str
    model: str
    store: str
    queries: int
    relevant_queries: int
    settings: ModeSettings
    ignore_identical_ids: bool
    encode_seconds: float
    collections: list[CollectionResult]
    run_files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # e.g. a collection missing some judged documents

    def header(self) -> str:
        ignored = "dropped" if self.ignore_identical_ids else "kept"
        s = self.settings
        return (
            f"{self.dataset} ({self.split}): {self.queries} judged queries ({self.relevant_queries} with a "
            f"relevant document), model {self.model}, {self.store}; {s.candidates} candidates per index, "
            f"top {s.depth} documents per query, documents whose id is the query's {ignored}"
        )

    def format(self) -> str:
        """The report in at most TABLE_COLUMNS columns: tables that fit, sentences wrapped."""
        lines = [*_wrap(self.header()), ""]
        base = self.collections[0]
        if len(self.collections) == 1:
            lines += [*_wrap(base.describe()), *self._table(base)]
        else:
            lines += self._compare()
        enc = self.encode_seconds
        qps = self.queries / enc if enc > 0 else 0.0
        lines += _wrap(
            f"queries encoded once for every mode and collection: {enc:.1f} s ({qps:.1f} queries/s); "
            "latency is the search alone; metrics from pytrec_eval (trec_eval)"
        )
        lines += [f"run file: {p}" for p in self.run_files]
        return "\n".join(lines)

    @staticmethod
    def _table(c: CollectionResult) -> list[str]:
        head = f"{'mode':<8}" + "".join(f"{TITLES[m]:>11}" for m in MEASURES)
        head += f"{'p50 ms':>9}{'p95 ms':>9}{'queries/s':>11}"
        rows = [head]
        for mode, r in c.modes.items():
            row = f"{mode:<8}" + "".join(f"{r.mean(m):>11.4f}" for m in MEASURES)
            row += f"{r.latency(50):>9.1f}{r.latency(95):>9.1f}{r.queries_per_s:>11.1f}"
            rows.append(row)
        return rows

    def _compare(self) -> list[str]:
        """The collections' measures, then their paired differences against the first: two tables that fit
        100 columns (collections named by their number above when a name is too long for that)."""
        base = self.collections[0]
        long_names = max(len(c.collection) for c in self.collections) > MAX_NAME_COLUMN
        labels = {
            c.collection: str(i + 1) if long_names else c.collection for i, c in enumerate(self.collections)
        }
        width = max(len("collection"), *(len(label) for label in labels.values())) + 2
        lines = [line for i, c in enumerate(self.collections) for line in _wrap(f"{i + 1}. {c.describe()}")]
        head = f"{'mode':<8}{'collection':<{width}}" + "".join(f"{TITLES[m]:>11}" for m in MEASURES)
        lines += ["", head + f"{'p95 ms':>9}"]
        for mode in base.modes:
            for c in self.collections:
                r = c.modes[mode]
                values = "".join(f"{r.mean(m):>11.4f}" for m in MEASURES)
                lines.append(f"{mode:<8}{labels[c.collection]:<{width}}{values}{r.latency(95):>9.1f}")
        lines += [
            "",
            *_wrap(
                f"d nDCG@10: paired per-query difference against {base.collection!r} (mean [95% CI of a "
                f"paired t-test], p of a {TEST_NAME} over the queries, beyond chance when p < {ALPHA}, "
                "queries better/equal/worse)"
            ),
            f"{'mode':<8}{'collection':<{width}}{'d nDCG@10 [95% CI]':<28}{'p':>7}  beyond chance  "
            "better/equal/worse",
        ]
        for mode in base.modes:
            for c in self.collections[1:]:
                d = paired(base.modes[mode], c.modes[mode])
                lo, hi = d.ci95()
                p = d.p_value()
                w, t, lo_n = d.wins_ties_losses()
                ci = f"{d.mean:+.4f} [{lo:+.4f}, {hi:+.4f}]"
                verdict = "yes" if beyond_chance(p) else "no"
                row = f"{mode:<8}{labels[c.collection]:<{width}}{ci:<28}{p:>7.3f}"
                lines.append(f"{row}  {verdict:<13}  {w}/{t}/{lo_n}")
        sizes = [c.bytes_per_chunk for c in self.collections]
        if sizes[0]:
            parts = [
                f"{c.collection} {s / 1024:.1f} KiB ({s / sizes[0]:.2f}x)"
                for c, s in zip(self.collections, sizes, strict=True)
                if s is not None
            ]
            lines += _wrap("bytes on disk per chunk: " + ", ".join(parts))
        return lines

    def to_json(self) -> dict[str, Any]:
        """{"dataset", "model", "modes": {mode: {ndcg@10, recall@100, mrr@10, latency_ms}},
        "bytes_per_chunk", ...} for the first collection; the others under "compare" with their paired
        nDCG@10 differences."""
        base = self.collections[0]
        out: dict[str, Any] = {
            "dataset": self.dataset,
            "split": self.split,
            "model": self.model,
            "queries": self.queries,
            "relevant_queries": self.relevant_queries,
            "candidates": self.settings.candidates,
            "depth": self.settings.depth,
            "weights": list(self.settings.weights),
            "ignore_identical_ids": self.ignore_identical_ids,
            "warnings": self.warnings,
            **base.to_json(),
        }
        if len(self.collections) > 1:
            out["compare"] = {
                c.collection: {
                    **c.to_json(),
                    f"paired_{PAIRED}": {m: paired(base.modes[m], r).to_json() for m, r in c.modes.items()},
                }
                for c in self.collections[1:]
            }
        return out
