"""PyTorch's oneDNN linear (bgem3_embeddings/backends/torch/kernels.py): its values against float64 numpy and
torch's own GEMM, the exact (erf) GELU it fuses, and where the runner may take it. The whole model through it
is held to FlagEmbedding by tests/test_backends.py (the PyTorch worker on an x86-64 CPU)."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.optional import require_module

torch = require_module("torch")

from bgem3_embeddings.backends.torch import kernels as torch_kernels  # noqa: E402  (after the torch check)

X86 = platform.machine().lower() in torch_kernels.X86_64
ROOT = Path(__file__).resolve().parents[1]


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
        got = torch_kernels.dense(*as_torch, gelu=gelu).double().numpy()
        theirs = torch.addmm(as_torch[2], as_torch[0], as_torch[1])
        theirs = (torch.nn.functional.gelu(theirs) if gelu else theirs).double().numpy()
    scale = np.abs(want).max()
    ours_error, torch_error = np.abs(got - want).max() / scale, np.abs(theirs - want).max() / scale
    assert ours_error < 1e-6, ours_error  # float32 rounding, relative to the outputs' size
    assert ours_error < 4 * max(torch_error, 1e-7)


def test_the_route_is_taken_only_where_it_runs_and_pays() -> None:
    assert torch_kernels.onednn_linear_problem("cuda", "float32") == "the device is cuda, not the CPU"
    assert "float16" in str(torch_kernels.onednn_linear_problem("cpu", "float16"))
    assert "arm64" in str(torch_kernels.onednn_linear_problem("cpu", "float32", machine="arm64"))
    if X86 and torch.backends.mkldnn.is_available():
        assert torch_kernels.onednn_linear_problem("cpu", "float32") is None
        assert torch_kernels.onednn_linear_problem("cpu", "bfloat16") is None


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
        got = torch_kernels.dense(*inputs, gelu=gelu)
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
    monkeypatch.setattr(torch_kernels, "dense", lambda x, kernel, bias, gelu=False: x @ kernel)  # no bias
    problem = torch_kernels.onednn_linear_problem("cpu", "float32")
    assert problem is not None and "is off by" in problem

    def missing(*args: object, **kwargs: object) -> None:
        raise RuntimeError("No such operator mkldnn::_linear_pointwise")

    monkeypatch.setattr(torch_kernels, "dense", missing)
    problem = torch_kernels.onednn_linear_problem("cpu", "float32")
    assert problem is not None and "No such operator" in problem


def test_the_benchmark_times_mkl_and_onednn_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/findings/torch_onednn_linear.py as docs/backends.md runs it: a row per projection shape,
    both GEMMs' GFLOP/s, their ratio and each one's error against float64."""
    from tests.support import load_benchmark

    assert load_benchmark("findings/torch_onednn_linear").main(["--tokens", "8", "--repeats", "1"]) == 0
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


def _reference_layer_and_weights(seed: int) -> tuple[object, tuple]:
    """transformers' XLMRobertaLayer with random weights (the reference's own layer code) and the same
    weights as torch_kernels.block_forward takes them: kernels (in, out), as Keras holds them."""
    from transformers import XLMRobertaConfig
    from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaLayer

    config = XLMRobertaConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128,
                              attn_implementation="eager")  # fmt: skip
    torch.manual_seed(seed)
    layer = XLMRobertaLayer(config).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_(0.0, 0.3)
    a = layer.attention
    linears = (a.self.query, a.self.key, a.self.value, a.output.dense, layer.intermediate.dense,
               layer.output.dense)  # fmt: skip
    weights: list = []
    for linear in linears:
        weights += [linear.weight.detach().t().contiguous(), linear.bias.detach()]
    for norm in (a.output.LayerNorm, layer.output.LayerNorm):
        weights += [norm.weight.detach(), norm.bias.detach()]
    return layer, tuple(weights)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunk", [None, 3])
def test_block_forward_is_transformers_layer(padded: bool, chunk: int | None) -> None:
    """The PyTorch runner's layer against transformers' XLMRobertaLayer on the same weights: right- and
    left-padded rows (keys masked), no mask at all, and attention a few query rows at a time."""
    layer, weights = _reference_layer_and_weights(seed=1)
    x = torch.randn(3, 7, 64)
    mask = torch.ones(3, 7, dtype=torch.bool)
    if padded:
        mask[1, 4:] = False  # right padding
        mask[2, :2] = False  # left padding
    with torch.inference_mode():
        additive = torch.zeros(3, 1, 1, 7).masked_fill(~mask.view(3, 1, 1, 7), torch.finfo(torch.float32).min)
        want = layer(x, attention_mask=additive)
        want = want[0] if isinstance(want, tuple) else want
        keep = mask.view(3, 1, 1, 7) if padded else None
        got = torch_kernels.block_forward(x, keep, weights, num_heads=4, epsilon=1e-5, chunk=chunk)
    # each row compared whole, pad positions included: their queries attend to the real keys on both sides
    assert got.shape == want.shape and got.dtype == torch.float32
    assert float((got - want).abs().max()) < 1e-5 * max(1.0, float(want.abs().max()))


def test_the_dispatch_benchmark_times_the_three_ways_side_by_side(tiny_checkpoint: Path) -> None:
    """benchmarks/findings/torch_dispatch.py as docs/backends.md runs it, in a process of its own on Keras'
    PyTorch backend: per shape the Keras layers, torch ops and (x86-64) torch ops with oneDNN, each row's
    ratio consistent with the times printed and the same dense vectors as the Keras layers."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "findings" / "torch_dispatch.py"), "--model",
         str(tiny_checkpoint), "--shapes", "1x8,2x16", "--repeats", "2"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "KERAS_BACKEND": "torch"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line[:1].isdigit()]
    names = [" ".join(row[1:-4]) for row in rows]
    expected = ["keras layers", "torch ops"] + (["torch ops + oneDNN"] if X86 else [])
    assert names == expected * 2
    for row in rows:
        base = float(next(r for r in rows if r[0] == row[0])[-4])  # the shape's keras layers row
        ms, ratio, gap = float(row[-4]), float(row[-3].rstrip("x")), float(row[-1])
        assert ms > 0 and abs(ratio - base / ms) <= 0.01 * ratio + 0.005
        assert gap < 1e-5
