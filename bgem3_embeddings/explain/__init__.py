"""Per-token explanations of BGE-M3's three scores (`BGEM3Encoder.explain`, `bgem3 explain`).

- `result`: the Explanation object and its JSON form (no TensorFlow).
- `decompose`: scores taken apart from encoded outputs (numpy).
- `render`: an Explanation as terminal text, 80 columns.
- `cli`: the `bgem3 explain QUERY PASSAGE` command.
"""

from bgem3_embeddings.explain.result import (
    ColbertMatch,
    ExplainedText,
    Explanation,
    SparseTerm,
    check_weights,
)

__all__ = ["ColbertMatch", "ExplainedText", "Explanation", "SparseTerm", "check_weights"]
