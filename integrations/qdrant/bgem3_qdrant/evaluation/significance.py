"""Is a per-query difference between two runs beyond chance? A paired sign-flip (permutation) test.

Under the null hypothesis the two runs are exchangeable on every query, so each per-query difference is
as likely to carry the opposite sign. The two-sided p-value is the share of sign assignments whose mean
difference is at least as far from 0 as the observed one: exact (every one of the 2^n assignments) up to
EXACT_MAX_QUERIES queries, else `draws` seeded random assignments (the observed one counted, so p > 0).
It assumes nothing about the shape of the differences (nDCG@10 differences are bounded and lumpy, where
a t-test's normal approximation is poor on few queries). Queries whose runs tie add nothing either way.

>>> round(sign_flip_p([0.1] * 6), 5)                 # 6 wins, no loss: 2 of 64 assignments as extreme
0.03125
>>> sign_flip_p([0.0, 0.0, 0.0])                      # identical runs
1.0
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

EXACT_MAX_QUERIES = 16  # 2^16 = 65,536 assignments: exact and fast
DRAWS = 10_000
SEED = 0  # the report's p-values are the same on every run
ALPHA = 0.05  # "beyond chance": p below this
TEST_NAME = "paired sign-flip permutation test, two-sided"
# A difference this small counts as a tie (float noise of equal rankings).
TIE = 1e-12


def sign_flip_p(diffs: Sequence[float] | np.ndarray, *, draws: int = DRAWS, seed: int = SEED) -> float:
    """Two-sided p-value of the mean of paired differences `diffs` (B - A per query) being 0."""
    d = np.asarray(diffs, dtype=np.float64)
    d = d[np.abs(d) > TIE]  # ties: the same under every sign
    if len(d) == 0:
        return 1.0
    observed = abs(d.sum())
    # Sums, not means (the same n); a tolerance so that assignments equal to the observed one count.
    slack = 1e-9 * max(1.0, observed)
    if len(d) <= EXACT_MAX_QUERIES:
        signs = _all_signs(len(d))
        return float(np.mean(np.abs(signs @ d) >= observed - slack))
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, draws, 1000):  # in blocks: 1,000 x n signs at a time
        signs = rng.choice((-1.0, 1.0), size=(min(1000, draws - start), len(d)))
        extreme += int(np.sum(np.abs(signs @ d) >= observed - slack))
    return (extreme + 1) / (draws + 1)


def _all_signs(n: int) -> np.ndarray:
    """Every assignment of n signs, one per row (2^n x n)."""
    bits = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    return np.where(bits == 1, -1.0, 1.0)


def beyond_chance(p: float, alpha: float = ALPHA) -> bool:
    return p < alpha
