"""backends/jax/kernels.py: which batches the JAX runner's cuDNN route takes, and why a device cannot take it.

The route's outputs are held to FlagEmbedding in tests/test_backends.py (its kernel swapped for XLA's on
the CPU) and on a GPU by benchmarks/gpu_check.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.optional import require_module

# Only a missing jax may skip (never under CI, and `make test` installs it); our module imports or fails.
require_module("jax", "the jax extra (in the dev extra)")
from bgem3_embeddings.backends.jax import kernels as jax_kernels  # noqa: E402


def test_right_padded_rows_give_their_lengths_and_padding_rows_count_one() -> None:
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    lengths = jax_kernels.right_padded_lengths(mask)
    assert lengths.dtype == np.int32
    assert lengths.tolist() == [3, 1, 4, 1]


@pytest.mark.parametrize(
    "mask",
    [
        [[0, 1, 1], [1, 1, 1]],  # left padding
        [[1, 0, 1]],  # a hole: not a length
        [1, 1, 0],  # not a batch
    ],
)
def test_other_masks_do_not_take_the_route(mask: list) -> None:
    assert jax_kernels.right_padded_lengths(np.array(mask)) is None


def test_why_a_device_cannot_take_the_route() -> None:
    assert "not a CUDA GPU" in jax_kernels.flash_attention_problem("cpu", "bfloat16")
    assert "float32" in jax_kernels.flash_attention_problem("cuda", "float32")
