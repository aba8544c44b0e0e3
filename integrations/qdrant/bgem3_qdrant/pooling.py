"""ColBERT token pooling: fewer stored rows per document, as colbert-ai and PyLate do it.

Clavié et al. 2024 ("Reducing the Footprint of Multi-Vector Retrieval with Minimal Performance Impact via
Token Pooling", arXiv 2409.14683) cluster a document's token vectors and store one mean vector per
cluster. This is colbert-ai's `pool_embeddings_hierarchical` (with no protected tokens) and PyLate's
`pool_factor`: Ward linkage over the rows of the (1 - cosine similarity) matrix, `max(rows // factor, 1)`
clusters cut with scipy's `fcluster(..., criterion="maxclust")`, each cluster's rows averaged and the
mean L2-normalised. Only documents are pooled; a query keeps every row (MaxSim takes each query token's
best match, so the query side decides what is compared).

`fcluster` with `maxclust` gives at most `max(rows // factor, 1)` clusters: exactly that many unless
merge heights tie exactly (duplicate rows), when it may give fewer.
"""

from __future__ import annotations

import warnings

import numpy as np

# Pool factors `ingest --colbert-pooling` accepts; 1 stores the rows as the model gives them.
POOL_FACTORS: tuple[int, ...] = (1, 2, 3, 4)


def check_pool_factor(factor: int) -> int:
    """`factor` if it is one of POOL_FACTORS, else ValueError naming the option."""
    if isinstance(factor, bool) or factor not in POOL_FACTORS:
        raise ValueError(f"--colbert-pooling must be 1 (off), 2, 3 or 4, not {factor!r}")
    return int(factor)


def pooled_row_count(rows: int, factor: int) -> int:
    """The clusters asked of `fcluster` for a document of `rows` ColBERT rows (the stored rows' upper
    bound; `rows` itself when pooling is off or there is a single row)."""
    if factor <= 1 or rows < 2:
        return rows
    return max(rows // factor, 1)


def pool_rows(rows: np.ndarray, factor: int) -> np.ndarray:
    """A document's ColBERT rows (tokens, dim), L2-normalised, pooled by `factor` (float32 out).

    factor 1, or fewer than two rows: the rows unchanged (as float32).
    """
    x = np.asarray(rows, dtype=np.float32)
    if factor <= 1 or len(x) < 2:
        return x
    # Imported here: scipy costs every command half a second to import, and only pooling needs it.
    from scipy.cluster.hierarchy import ClusterWarning, fcluster, linkage

    # As colbert-ai: similarities in float32 (rows are unit vectors), distance 1 - similarity, then each
    # row of that matrix is an observation for Ward linkage (scipy computes in float64).
    distances = 1.0 - x @ x.T
    with warnings.catch_warnings():
        # scipy suspects a square distance matrix passed by mistake; here its rows are meant as observations.
        warnings.simplefilter("ignore", ClusterWarning)
        tree = linkage(distances, method="ward", metric="euclidean")
    clusters = pooled_row_count(len(x), factor)
    labels = fcluster(tree, t=clusters, criterion="maxclust")
    # Cluster ids 1..clusters in order (the order colbert-ai appends them); an id fcluster did not use
    # has no row and gives no vector.
    used = np.unique(labels)
    onehot = (labels[None, :] == used[:, None]).astype(np.float32)
    means = (onehot @ x) / onehot.sum(axis=1, keepdims=True)
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    return (means / np.maximum(norms, 1e-12)).astype(np.float32)


def pool_documents(colbert: list[np.ndarray], factor: int) -> list[np.ndarray]:
    """`pool_rows` over each document's rows (the list unchanged when pooling is off)."""
    if factor <= 1:
        return colbert
    return [pool_rows(rows, factor) for rows in colbert]
