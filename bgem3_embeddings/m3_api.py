"""The part of FlagEmbedding's `BGEM3FlagModel` API that needs nothing but `encode`: shared by the encoder
in this process (`BGEM3Encoder`) and the one behind a server (`RemoteEncoder`), so both answer the same
calls the same way. No TensorFlow here.

    >>> class Echo(M3EncodeAPI):                     # doctest: +SKIP
    ...     query_max_length, passage_max_length = 8, 512
    ...     def encode(self, sentences, batch_size=None, max_length=None, *outputs): ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bgem3_embeddings.explain.result import Explanation
from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS, colbert_score, lexical_matching_score


class M3EncodeAPI:
    """encode_queries / encode_corpus (encode with the query or passage length) and the two pair scores.

    A subclass has `query_max_length` and `passage_max_length` (attributes or properties).
    """

    def _default_length(self, kind: str) -> int:
        # read by name: one subclass holds them as attributes, the other as properties of its server
        return int(getattr(self, f"{kind}_max_length"))

    def encode(
        self,
        sentences: str | Sequence[str],
        batch_size: int | None = None,
        max_length: int | None = None,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
    ) -> dict[str, Any]:
        raise NotImplementedError

    def encode_queries(
        self,
        queries: str | Sequence[str],
        batch_size: int | None = None,
        max_length: int | None = None,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
    ) -> dict[str, Any]:
        """encode() with max_length defaulting to query_max_length."""
        return self.encode(
            queries, batch_size, max_length or self._default_length("query"), return_dense, return_sparse,
            return_colbert_vecs,
        )

    def encode_corpus(
        self,
        corpus: str | Sequence[str],
        batch_size: int | None = None,
        max_length: int | None = None,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
    ) -> dict[str, Any]:
        """encode() with max_length defaulting to passage_max_length."""
        return self.encode(
            corpus, batch_size, max_length or self._default_length("passage"), return_dense, return_sparse,
            return_colbert_vecs,
        )

    def explain_many(
        self,
        query: str,
        passages: Sequence[str],
        *,
        weights: Sequence[float] = DEFAULT_MODE_WEIGHTS,
        colbert_matrix: bool = False,
        max_query_length: int | None = None,
        max_passage_length: int | None = None,
    ) -> list[Explanation]:
        """explain() of one query against several passages, all encoded in one call."""
        raise NotImplementedError

    def explain(
        self,
        query: str,
        passage: str,
        *,
        weights: Sequence[float] = DEFAULT_MODE_WEIGHTS,
        colbert_matrix: bool = False,
        max_query_length: int | None = None,
        max_passage_length: int | None = None,
    ) -> Explanation:
        """Why `passage` scores what it scores for `query`, per mode and per token.

        The totals are FlagEmbedding's: `compute_lexical_matching_score`, `colbert_score` and
        `compute_score(..., weights_for_different_modes=weights)["colbert+sparse+dense"]` (weights: dense,
        sparse, colbert; default 0.4, 0.2, 0.4 as BGE-M3's model card uses). The query and the passage are
        truncated at max_query_length / max_passage_length as compute_score truncates them.

            >>> e = model.explain("What is BGE M3?", "BGE M3 is an embedding model")   # doctest: +SKIP
            >>> e.sparse_terms[0].text, e.colbert_matches[0].similarity, e.combined    # doctest: +SKIP
        """
        return self.explain_many(
            query,
            [passage],
            weights=weights,
            colbert_matrix=colbert_matrix,
            max_query_length=max_query_length,
            max_passage_length=max_passage_length,
        )[0]

    @staticmethod
    def compute_lexical_matching_score(lexical_weights_1: dict, lexical_weights_2: dict) -> float:
        return lexical_matching_score(lexical_weights_1, lexical_weights_2)

    @staticmethod
    def colbert_score(q_reps: np.ndarray, p_reps: np.ndarray) -> float:
        return colbert_score(q_reps, p_reps)
