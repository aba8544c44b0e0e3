"""The machine's matmul peak, measured: FFN-shaped GEMMs in float32 and bfloat16 with TensorFlow and torch.

The bench divides each engine's achieved FLOP rate by the best of these (per dtype), so "% of peak" says
how close to the hardware's practical limit a whole forward pass gets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger(__name__)

# (tokens, hidden) @ (hidden, ffn): the shape of BGE-M3's largest matmuls.
M, K, N = 2048, 1024, 4096
MIN_SECONDS = 1.0


def _rate(step: Callable[[], object], flops: float, rounds: int = 3) -> float:
    """GFLOP/s of the best round; each round repeats `step` for at least MIN_SECONDS."""
    step()  # warm-up: kernel selection, allocation
    best = 0.0
    for _ in range(rounds):
        n, start = 0, time.perf_counter()
        while True:
            step()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= MIN_SECONDS:
                break
        best = max(best, n * flops / elapsed / 1e9)
    return best


DTYPES = ("float32", "bfloat16")


def tensorflow_peaks(tokens: int = M, dtypes: Sequence[str] = DTYPES) -> dict[str, float]:
    import tensorflow as tf

    out = {}
    for name in dtypes:
        dtype = tf.as_dtype(name)
        a = tf.cast(tf.random.normal((tokens, K)), dtype)
        b = tf.cast(tf.random.normal((K, N)), dtype)
        matmul = tf.function(lambda x, y: tf.matmul(x, y))
        out[name] = _rate(lambda: matmul(a, b).numpy(), 2.0 * tokens * K * N)  # noqa: B023 - used at once
    return out


def torch_peaks(tokens: int = M, dtypes: Sequence[str] = DTYPES) -> dict[str, float]:
    import torch

    out = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        a = torch.randn(tokens, K).to(dtype)
        b = torch.randn(K, N).to(dtype)
        out[name] = _rate(lambda: torch.mm(a, b), 2.0 * tokens * K * N)  # noqa: B023 - used at once
    return out


def measure_peaks(
    libraries: Sequence[str] = ("tensorflow", "torch"), tokens: int = M, dtypes: Sequence[str] = DTYPES
) -> dict[str, dict[str, float]]:
    """{library: {dtype: GFLOP/s}} for the libraries that are installed, for `dtypes` only.

    `tokens`: rows of the (tokens, 1024) @ (1024, 4096) GEMM. Without native bf16 (AVX2-only CPUs) one
    bfloat16 GEMM of the full 2048 rows takes seconds in TensorFlow and about a minute in torch (a plain
    loop), so the bench asks for bfloat16 only when a bfloat16 precision is benchmarked.
    """
    runners = {"tensorflow": tensorflow_peaks, "torch": torch_peaks}
    result = {}
    for library in libraries:
        try:
            result[library] = runners[library](tokens, dtypes)
        except ImportError as err:
            logger.info("%s not installed: no %s peak (%s)", library, library, err)
    return result


def peak_dtypes(precisions: Sequence[str]) -> tuple[str, ...]:
    """The matmul dtypes worth a peak for these bench precisions ("weights" or "weights:compute").

    >>> peak_dtypes(["float32", "int8"]), peak_dtypes(["float32", "bfloat16:float32"])
    (('float32',), ('float32', 'bfloat16'))
    """
    wanted = {"float32"}  # every report compares against the float32 peak
    if any("bfloat16" in spec.split(":") for spec in precisions):
        wanted.add("bfloat16")
    return tuple(d for d in DTYPES if d in wanted)


def best_peaks(peaks: dict[str, dict[str, float]]) -> dict[str, float]:
    """The highest rate per dtype across libraries: the peak the bench compares against."""
    best: dict[str, float] = {}
    for rates in peaks.values():
        for dtype, rate in rates.items():
            best[dtype] = max(best.get(dtype, 0.0), rate)
    return best
