"""PyTorch's oneDNN linear (bgem3_embeddings/kernels_torch.py): its values against float64 numpy and torch's
own GEMM, the exact (erf) GELU it fuses, and where the runner may take it. The whole model through it is
held to FlagEmbedding by tests/test_backends.py (the PyTorch worker on an x86-64 CPU)."""

from __future__ import annotations

import math
import platform

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from bgem3_embeddings import kernels_torch  # noqa: E402  (after the torch check)

X86 = platform.machine().lower() in kernels_torch.X86_64


def _erf_gelu(y: np.ndarray) -> np.ndarray:
    return 0.5 * y * (1.0 + np.vectorize(math.erf)(y / math.sqrt(2.0)))


@pytest.mark.skipif(not X86, reason="oneDNN's linear is taken on x86-64 CPUs only")
@pytest.mark.parametrize("gelu", [False, True])
def test_onednn_linear_matches_float64_as_closely_as_torch_does(gelu: bool) -> None:
    rng = np.random.default_rng(0)
    # BGE-M3's FFN input width, weights of its scale, a (tokens, 1024) batch
    x, kernel, bias = rng.normal(size=(64, 1024)), rng.normal(size=(1024, 256)) * 0.03, rng.normal(size=256)
    want = x @ kernel + bias
    want = _erf_gelu(want) if gelu else want
    as_torch = [torch.from_numpy(a.astype(np.float32)) for a in (x, kernel, bias)]
    with torch.inference_mode():
        got = kernels_torch.dense(*as_torch, gelu=gelu).double().numpy()
        theirs = torch.addmm(as_torch[2], as_torch[0], as_torch[1])
        theirs = (torch.nn.functional.gelu(theirs) if gelu else theirs).double().numpy()
    scale = np.abs(want).max()
    ours_error, torch_error = np.abs(got - want).max() / scale, np.abs(theirs - want).max() / scale
    assert ours_error < 1e-6, ours_error  # float32 rounding, relative to the outputs' size
    assert ours_error < 4 * max(torch_error, 1e-7)


def test_the_route_is_taken_only_where_it_runs_and_pays() -> None:
    assert kernels_torch.onednn_linear_problem("cuda", "float32") == "the device is cuda, not the CPU"
    assert "float16" in str(kernels_torch.onednn_linear_problem("cpu", "float16"))
    assert "arm64" in str(kernels_torch.onednn_linear_problem("cpu", "float32", machine="arm64"))
    if X86 and torch.backends.mkldnn.is_available():
        assert kernels_torch.onednn_linear_problem("cpu", "float32") is None
        assert kernels_torch.onednn_linear_problem("cpu", "bfloat16") is None


@pytest.mark.skipif(not X86, reason="oneDNN's linear is taken on x86-64 CPUs only")
@pytest.mark.parametrize("gelu", [False, True])
def test_onednn_linear_in_bfloat16_rounds_once_like_torch(gelu: bool) -> None:
    """bf16 inputs, float32 accumulation, one rounding to bf16: within a unit of bf16 of the float64 result
    of the same (bf16-valued) inputs, never further off than torch's addmm (+ GELU) in bf16."""
    rng = np.random.default_rng(1)
    arrays = (rng.normal(size=(64, 1024)), rng.normal(size=(1024, 256)) * 0.03, rng.normal(size=256))
    inputs = [torch.from_numpy(a.astype(np.float32)).bfloat16() for a in arrays]
    x, kernel, bias = (t.double().numpy() for t in inputs)
    want = x @ kernel + bias
    want = _erf_gelu(want) if gelu else want
    with torch.inference_mode():
        got = kernels_torch.dense(*inputs, gelu=gelu)
        theirs = torch.addmm(inputs[2], inputs[0], inputs[1])
        theirs = torch.nn.functional.gelu(theirs) if gelu else theirs
    assert got.dtype == torch.bfloat16
    scale = np.maximum(1.0, np.abs(want))
    ours_error = (np.abs(got.double().numpy() - want) / scale).max()
    torch_error = (np.abs(theirs.double().numpy() - want) / scale).max()
    assert ours_error <= 2.0**-8, ours_error
    assert ours_error <= torch_error + 2.0**-9


def test_a_linear_that_disagrees_with_torch_is_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    if not X86:
        pytest.skip("the probe runs on x86-64 CPUs only")
    monkeypatch.setattr(kernels_torch, "dense", lambda x, kernel, bias, gelu=False: x @ kernel)  # no bias
    problem = kernels_torch.onednn_linear_problem("cpu", "float32")
    assert problem is not None and "is off by" in problem

    def missing(*args: object, **kwargs: object) -> None:
        raise RuntimeError("No such operator mkldnn::_linear_pointwise")

    monkeypatch.setattr(kernels_torch, "dense", missing)
    problem = kernels_torch.onednn_linear_problem("cpu", "float32")
    assert problem is not None and "No such operator" in problem


def test_the_benchmark_times_mkl_and_onednn_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/torch_onednn_linear.py as docs/backends.md runs it: a row per projection shape, both
    GEMMs' GFLOP/s, their ratio and each one's error against float64."""
    from tests.support import load_benchmark

    assert load_benchmark("torch_onednn_linear").main(["--tokens", "8", "--repeats", "1"]) == 0
    rows = [
        line.split()
        for line in capsys.readouterr().out.splitlines()
        if line.rstrip().endswith(tuple("0123456789"))
    ]
    rows = [r for r in rows if r[-6].isdigit()]  # tokens column: the table's rows, not its header
    assert len(rows) == 3
    for row in rows:
        mkl, onednn, ratio = (float(v.replace(",", "").rstrip("x")) for v in row[-5:-2])
        assert mkl > 0 and onednn > 0
        assert abs(ratio * mkl - onednn) <= 0.5 * ratio + 0.5 + 0.01 * onednn  # GFLOP/s printed rounded
        assert max(float(row[-2]), float(row[-1])) < 1e-5
