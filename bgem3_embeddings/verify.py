"""Check an install against the numbers BAAI published for the real BGE-M3 weights (facts section 4).

`bgem3 verify` runs these with the real checkpoint; the comparison logic takes the expectations as data so
it can be tested with a tiny checkpoint and expectations from an independent reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from bgem3_embeddings.config import BGEM3Config
from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS

SENTENCES_1 = ["What is BGE M3?", "Defination of BM25"]
SENTENCES_2 = [
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms "
    "appearing in each document",
]


# BAAI/bge-m3's network sizes (its config.json, https://huggingface.co/BAAI/bge-m3): BGEM3Config's defaults.
# A checkpoint of other sizes cannot hold BAAI's weights, so there is nothing to compare.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
BAAI_SHAPE = {name: getattr(BGEM3Config(), name) for name in SHAPE_FIELDS}
# The published numbers are fp16 outputs; bf16 and int8 stay within 2e-2 of them. A difference this large
# is another model's output, not rounding.
FOREIGN_DIFFERENCE = 0.05
NOT_CHECKED = (
    "the published numbers `bgem3 verify` compares with apply only to BAAI/bge-m3's weights; "
    "to check this install, run: bgem3 verify --model BAAI/bge-m3 (a 2.3 GB download)"
)


@dataclass(frozen=True)
class ReferenceNumbers:
    """Expected outputs for SENTENCES_1 / SENTENCES_2 (defaults: the published fp16 numbers)."""

    dense_similarity: list[list[float]] = field(default_factory=lambda: [[0.6265, 0.3477], [0.3499, 0.678]])
    # Lexical weights of SENTENCES_1[0], by decoded token.
    lexical_weights_by_token: dict[str, float] = field(
        default_factory=lambda: {
            "What": 0.08356,
            "is": 0.0814,
            "B": 0.1296,
            "GE": 0.252,
            "M": 0.1702,
            "3": 0.2695,
            "?": 0.04092,
        }
    )
    lexical_score_s1_0_s2_0: float = 0.19554
    lexical_score_s1_0_s1_1: float = 0.0
    colbert_score_s1_0_s2_0: float = 0.7797
    colbert_score_s1_0_s2_1: float = 0.4620
    # compute_score over (s1[0],s2[0]), (s1[0],s2[1]), (s1[1],s2[0]), (s1[1],s2[1]).
    compute_score: dict[str, list[float]] = field(
        default_factory=lambda: {
            "colbert": [0.77965, 0.46215, 0.45238, 0.78986],
            "sparse": [0.19556, 0.00880, 0.0, 0.18030],
            "dense": [0.62598, 0.34741, 0.34985, 0.67822],
            "colbert+sparse+dense": [0.60136, 0.32558, 0.32089, 0.62329],
        }
    )
    compute_score_max_passage_length: int = 128
    compute_score_weights: tuple[float, float, float] = DEFAULT_MODE_WEIGHTS  # the model card's call


@dataclass(frozen=True)
class Check:
    name: str
    expected: float
    actual: float
    tolerance: float

    @property
    def difference(self) -> float:
        return abs(self.actual - self.expected)

    @property
    def ok(self) -> bool:
        return bool(np.isfinite(self.actual)) and self.difference <= self.tolerance


class EncoderLike(Protocol):
    def encode(self, sentences: Any, **kwargs: Any) -> dict[str, Any]: ...
    def compute_score(self, sentence_pairs: Any, **kwargs: Any) -> dict[str, Any]: ...
    def convert_id_to_token(self, lexical_weights: Any) -> Any: ...
    def compute_lexical_matching_score(self, a: dict, b: dict) -> float: ...
    def colbert_score(self, q: np.ndarray, p: np.ndarray) -> float: ...


def run_checks(
    encoder: EncoderLike, expected: ReferenceNumbers | None = None, tolerance: float = 2e-3
) -> list[Check]:
    """Encode the reference sentences and compare every published number; returns one Check each."""
    ref = expected or ReferenceNumbers()
    kw = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    out1, out2 = encoder.encode(SENTENCES_1, **kw), encoder.encode(SENTENCES_2, **kw)
    checks: list[Check] = []
    similarity = out1["dense_vecs"] @ out2["dense_vecs"].T
    for i in range(2):
        for j in range(2):
            checks.append(
                Check(
                    f"dense similarity s1[{i}]·s2[{j}]",
                    ref.dense_similarity[i][j],
                    float(similarity[i, j]),
                    tolerance,
                )
            )
    by_token = {
        k.strip(): float(v) for k, v in encoder.convert_id_to_token(out1["lexical_weights"][0]).items()
    }
    for token, weight in ref.lexical_weights_by_token.items():
        checks.append(
            Check(
                f"lexical weight of {token!r} in s1[0]", weight, by_token.get(token, float("nan")), tolerance
            )
        )
    lw1, lw2 = out1["lexical_weights"], out2["lexical_weights"]
    checks.append(
        Check(
            "lexical score s1[0]·s2[0]",
            ref.lexical_score_s1_0_s2_0,
            encoder.compute_lexical_matching_score(lw1[0], lw2[0]),
            tolerance,
        )
    )
    checks.append(
        Check(
            "lexical score s1[0]·s1[1]",
            ref.lexical_score_s1_0_s1_1,
            encoder.compute_lexical_matching_score(lw1[0], lw1[1]),
            tolerance,
        )
    )
    cv1, cv2 = out1["colbert_vecs"], out2["colbert_vecs"]
    checks.append(
        Check(
            "colbert score s1[0]·s2[0]",
            ref.colbert_score_s1_0_s2_0,
            encoder.colbert_score(cv1[0], cv2[0]),
            tolerance,
        )
    )
    checks.append(
        Check(
            "colbert score s1[0]·s2[1]",
            ref.colbert_score_s1_0_s2_1,
            encoder.colbert_score(cv1[0], cv2[1]),
            tolerance,
        )
    )
    pairs = [(q, p) for q in SENTENCES_1 for p in SENTENCES_2]
    scores = encoder.compute_score(
        pairs,
        max_passage_length=ref.compute_score_max_passage_length,
        weights_for_different_modes=list(ref.compute_score_weights),
    )
    for key, values in ref.compute_score.items():
        for n, value in enumerate(values):
            checks.append(Check(f"compute_score {key} pair {n}", value, float(scores[key][n]), tolerance))
    return checks


def format_report(checks: list[Check]) -> str:
    """A table of every check with its difference, and a one-line verdict."""
    lines = [f"{'check':44} {'expected':>10} {'actual':>10} {'diff':>9}  ok"]
    for c in checks:
        lines.append(
            f"{c.name:44} {c.expected:10.5f} {c.actual:10.5f} {c.difference:9.2e}  {'yes' if c.ok else 'NO'}"
        )
    failed = [c for c in checks if not c.ok]
    worst = max((c.difference for c in checks if np.isfinite(c.actual)), default=0.0)
    lines.append(
        f"{len(checks) - len(failed)} of {len(checks)} checks within tolerance"
        + (f" {max(c.tolerance for c in checks):g}" if checks else "")
        + "; "
        f"largest difference {worst:.2e}" + ("" if not failed else f"; FAILED: {_failed_names(failed)}")
    )
    return "\n".join(lines)


def _failed_names(failed: list[Check], most: int = 5) -> str:
    """The failed checks by name when few, else their count (each row above says NO)."""
    if len(failed) <= most:
        return ", ".join(c.name for c in failed)
    return f"{len(failed)} checks (the rows marked NO)"


def shape_differences(config: BGEM3Config) -> list[str]:
    """Where this network's sizes differ from BAAI/bge-m3's (empty: the same sizes)."""
    return [
        f"{name} {getattr(config, name)}, BAAI's {want}"
        for name, want in BAAI_SHAPE.items()
        if getattr(config, name) != want
    ]


def not_baai_message(model: str, fingerprint: str, differences: list[str]) -> str:
    """The one message for a checkpoint whose sizes are not BAAI's: which weights these are, and why the
    published numbers do not apply."""
    return (
        f"{model} does not hold BAAI's BGE-M3 weights (fingerprint {fingerprint[:16]}; "
        f"{'; '.join(differences)}): {NOT_CHECKED}"
    )


def foreign_outputs_message(checks: list[Check], fingerprint: str) -> str | None:
    """A first line for a report whose differences are too large for any precision (None otherwise)."""
    failed = [c for c in checks if not c.ok]
    missing = sum(not np.isfinite(c.actual) for c in failed)  # a published token this tokenizer lacks
    worst = max((c.difference for c in failed if np.isfinite(c.actual)), default=0.0)
    if worst < FOREIGN_DIFFERENCE and not missing:
        return None
    return (
        f"these weights (fingerprint {fingerprint[:16]}) do not behave like BAAI's BGE-M3: {len(failed)} of "
        f"{len(checks)} outputs differ from the published numbers (by up to {worst:.2f}"
        + (f", {missing} missing" if missing else "")
        + "), far beyond any "
        "precision's rounding (a fine-tune, another model, or damaged files; if they are BAAI's own files, "
        f"please report this output); {NOT_CHECKED}"
    )
