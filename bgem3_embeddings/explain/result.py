"""What `explain(query, passage)` returns: each mode's score taken apart into per-token parts.

Plain data (no TensorFlow), with a JSON form (`to_dict` / `from_dict`) that `POST /v1/bgem3/explain` sends
and `RemoteEncoder.explain` reads back, so a local and a remote explanation are the same object.

    e = encoder.explain("What is BGE M3?", "BGE M3 is an embedding model ...")
    e.sparse, e.sparse_terms[0].text, e.sparse_terms[0].product       # 0.1955, 'GE', 0.0759
    e.colbert_matches[0]                                               # query token -> best passage token
    e.combined, e.parts                                # compute_score's weighted sum, per mode
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bgem3_embeddings.tokenizer import TokenSpan

MODE_NAMES = ("dense", "sparse", "colbert")  # the order of FlagEmbedding's weights_for_different_modes
WORD_START = "\u2581"  # sentencepiece's word-start mark, a vocabulary entry of its own


@dataclass(frozen=True)
class ExplainedText:
    """A text as the model saw it: its tokens (with <s> and </s>) and whether it was cut at max_length;
    `whole_tokens`: the whole text's tokens (with <s> and </s>) when it was cut (`token_count` either way)."""

    text: str
    tokens: tuple[TokenSpan, ...]
    truncated: bool = False
    whole_tokens: int | None = None

    @property
    def token_count(self) -> int:
        return self.whole_tokens if self.whole_tokens is not None else len(self.tokens)

    @property
    def ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    def surface(self, index: int) -> str:
        """The characters of token `index` in the text; a special token's own name (e.g. '</s>'), and '▁' for
        the word-start piece alone (the tokenizer gives it the span of the character after it)."""
        token = self.tokens[index]
        if token.special or token.stop <= token.start or token.piece == WORD_START:
            return token.piece
        return self.text[token.start : token.stop]

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "truncated": self.truncated,
            "token_count": self.token_count,
            "tokens": [
                {"id": t.id, "token": t.piece, "start": t.start, "stop": t.stop, "special": t.special}
                for t in self.tokens
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExplainedText:
        tokens = tuple(
            TokenSpan(int(t["id"]), str(t["token"]), int(t["start"]), int(t["stop"]), bool(t["special"]))
            for t in data["tokens"]
        )
        count = data.get("token_count")  # absent from a server of an earlier release
        whole = int(count) if count is not None else None
        return cls(str(data["text"]), tokens, bool(data.get("truncated", False)), whole)


Span = tuple[int, int]


@dataclass(frozen=True)
class SparseTerm:
    """A token id present in both lexical weight dicts: its part of the lexical matching score.

    `product` = query_weight * passage_weight; `share` = product / the sparse score. The weights are the
    reference's per-id maxima; the spans are every place the id occurs in each text.
    """

    token_id: int
    token: str  # the vocabulary entry, e.g. '▁BGE'
    text: str  # its characters in the passage (first occurrence)
    query_weight: float
    passage_weight: float
    product: float
    share: float
    query_spans: tuple[Span, ...] = ()
    passage_spans: tuple[Span, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "token_id": self.token_id,
            "token": self.token,
            "text": self.text,
            "query_weight": self.query_weight,
            "passage_weight": self.passage_weight,
            "product": self.product,
            "share": self.share,
            "query_spans": [list(s) for s in self.query_spans],
            "passage_spans": [list(s) for s in self.passage_spans],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SparseTerm:
        return cls(
            int(data["token_id"]),
            str(data["token"]),
            str(data["text"]),
            float(data["query_weight"]),
            float(data["passage_weight"]),
            float(data["product"]),
            float(data["share"]),
            tuple((int(a), int(b)) for a, b in data["query_spans"]),
            tuple((int(a), int(b)) for a, b in data["passage_spans"]),
        )


@dataclass(frozen=True)
class ColbertMatch:
    """One query token's best passage token under ColBERT MaxSim.

    Token indices count <s> as 0 in each text (so they index `ExplainedText.tokens`); ColBERT vectors start at
    token 1, as FlagEmbedding drops the <s> vector and keeps </s>. `contribution` = similarity / number of
    query vectors (the mean's term); `share` = contribution / the ColBERT score.
    """

    query_token: int
    passage_token: int
    similarity: float
    contribution: float
    share: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "query_token": self.query_token,
            "passage_token": self.passage_token,
            "similarity": self.similarity,
            "contribution": self.contribution,
            "share": self.share,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ColbertMatch:
        return cls(
            int(data["query_token"]),
            int(data["passage_token"]),
            float(data["similarity"]),
            float(data["contribution"]),
            float(data["share"]),
        )


@dataclass
class Explanation:
    """Why a passage scores what it scores against a query, mode by mode (FlagEmbedding's numbers).

    dense: cosine of the two CLS vectors. sparse: sum of `sparse_terms` products
    (= compute_lexical_matching_score). colbert: mean of the `colbert_matches` similarities (= colbert_score);
    `colbert_matrix[i, j]` is query vector i (token i + 1) x passage vector j (token j + 1), when asked for.
    combined: compute_score's "colbert+sparse+dense" with `weights` (dense, sparse, colbert); `parts` holds
    each mode's weighted term of it (they sum to `combined`).
    """

    query: ExplainedText
    passage: ExplainedText
    dense: float
    sparse: float
    colbert: float
    combined: float
    weights: tuple[float, float, float]
    parts: dict[str, float]
    sparse_terms: list[SparseTerm] = field(default_factory=list)
    colbert_matches: list[ColbertMatch] = field(default_factory=list)
    colbert_matrix: np.ndarray | None = None

    @property
    def scores(self) -> dict[str, float]:
        """{'dense', 'sparse', 'colbert', 'all'}: the four numbers a person compares first."""
        return {"dense": self.dense, "sparse": self.sparse, "colbert": self.colbert, "all": self.combined}

    def to_dict(self, with_matrix: bool = True) -> dict[str, Any]:
        """The JSON form; with_matrix=False leaves `colbert.matrix` None (a caller that writes it in pieces:
        an 8192 x 8192 matrix is 67M numbers)."""
        has_matrix = with_matrix and self.colbert_matrix is not None
        matrix = np.asarray(self.colbert_matrix).tolist() if has_matrix else None
        return {
            "query": self.query.to_dict(),
            "passage": self.passage.to_dict(),
            "dense": {"score": self.dense},
            "sparse": {"score": self.sparse, "terms": [t.to_dict() for t in self.sparse_terms]},
            "colbert": {
                "score": self.colbert,
                "matches": [m.to_dict() for m in self.colbert_matches],
                "matrix": matrix,
            },
            "all": {
                "score": self.combined,
                "weights": dict(zip(MODE_NAMES, self.weights, strict=True)),
                "parts": dict(self.parts),
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Explanation:
        colbert = data["colbert"]
        matrix = colbert.get("matrix")
        weights = data["all"]["weights"]
        return cls(
            query=ExplainedText.from_dict(data["query"]),
            passage=ExplainedText.from_dict(data["passage"]),
            dense=float(data["dense"]["score"]),
            sparse=float(data["sparse"]["score"]),
            colbert=float(colbert["score"]),
            combined=float(data["all"]["score"]),
            weights=(float(weights["dense"]), float(weights["sparse"]), float(weights["colbert"])),
            parts={k: float(v) for k, v in data["all"]["parts"].items()},
            sparse_terms=[SparseTerm.from_dict(t) for t in data["sparse"]["terms"]],
            colbert_matches=[ColbertMatch.from_dict(m) for m in colbert["matches"]],
            colbert_matrix=None if matrix is None else np.asarray(matrix, dtype=np.float32),
        )


def check_weights(weights: Sequence[float]) -> tuple[float, float, float]:
    """(w_dense, w_sparse, w_colbert) as floats: three finite numbers >= 0 with a positive sum.

    ValueError naming what is wrong. (FlagEmbedding takes any numbers; a negative weight would rank a
    passage higher for matching worse, and a zero sum has no weighted mean.)
    """
    try:
        values = tuple(float(w) for w in weights)
    except (TypeError, ValueError) as err:
        raise ValueError(f"weights must be 3 numbers (dense, sparse, colbert), got {weights!r}") from err
    if len(values) != 3 or not all(np.isfinite(values)) or min(values) < 0:
        raise ValueError(
            f"weights must be 3 finite numbers >= 0 (dense, sparse, colbert), got {list(weights)}"
        )
    if sum(values) <= 0:
        raise ValueError(f"weights must not sum to zero, got {list(values)}")
    return values[0], values[1], values[2]
