"""Tolerances for comparing float32 results of the same maths computed in another order.

Batch vs single text, chunked vs full attention and oneDNN on vs off change matmul shapes and so the order
in which float32 sums are taken: results then differ by a few ulps of the magnitudes involved (eps = 1.19e-7,
so 1 ulp is 4.8e-7 at 4.0). A fixed absolute 1e-6 is only two ulps there and failed on an AVX2-only AMD CPU.
A wrong path (a pad position's state, shifted ColBERT rows) is off by 1e-2 or more, so these still catch it.

Example:
    np.testing.assert_allclose(single, batched, **UNIT_VECTORS)
"""

from __future__ import annotations

# L2-normalised dense and ColBERT rows: every element is at most 1 in size (84 ulps at 1.0).
UNIT_VECTORS = {"rtol": 0.0, "atol": 1e-5}
# Unbounded values (ReLU lexical weights, scores, hidden states): relative to their size.
SCALED = {"rtol": 1e-5, "atol": 1e-5}
# The same for pytest.approx.
APPROX = {"rel": 1e-5, "abs": 1e-5}
