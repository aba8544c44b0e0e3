"""PyTorch's fast path beside its portable twin: the layer in torch ops, its projections through oneDNN's
fused linear (+ exact GELU) on an x86-64 CPU.

`block_forward` is `backends.portable.kernels.block_forward`'s math written in torch ops (addmm, layer_norm,
scaled_dot_product_attention): the PyTorch runner calls it for every layer, so eager PyTorch pays its own
dispatch per op and not Keras' on top (about 1 ms per layer on a 2-vCPU AMD EPYC: a 16-token query 1.20x
with the same GEMMs, benchmarks/findings/torch_dispatch.py). tests/test_kernels_torch.py holds it to
transformers' XLMRobertaLayer on the same weights; tests/test_backends.py the whole model to FlagEmbedding.

PyTorch's own GEMM (`addmm_dense`, torch.matmul in the Keras layers) runs float32 in MKL on an x86-64
CPU. On an AMD Zen 5, 2048 tokens, MKL reached 205 GFLOP/s on a 1024 -> 1024 projection and 178 on the
FFN's 1024 -> 4096 with its GELU, where oneDNN (what TensorFlow runs, and PyTorch itself for bf16)
reached 480 and 347 (benchmarks/findings/torch_onednn_linear.py; docs/backends.md): the whole model 1.80x.
`torch.ops.mkldnn._linear_pointwise` is that oneDNN kernel: the op PyTorch's own compiler (inductor) emits
for a linear layer on the CPU. It takes the Keras kernel's transpose as a view (no copy of the weights) and
fuses the bias and the GELU.

In bfloat16 PyTorch's GEMMs run in oneDNN already (about 805 GFLOP/s on that CPU either way), but its
GELU is a separate pass: the fused call took the FFN's 1024 -> 4096 from 522 to 785 GFLOP/s.

Where it runs is decided once, in the PyTorch runner (`backends/torch/runner.py`): the CPU, float32 or
bfloat16 matmuls, an x86-64 machine, a PyTorch built with oneDNN, and a probe call that matches float32
math on the same inputs. `onednn_linear_problem` says why not otherwise.

    >>> onednn_linear_problem("mps", "float32")
    'the device is mps, not the CPU'
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn import functional

X86_64 = ("x86_64", "amd64")
# The probe's tolerance per compute dtype: the largest |oneDNN - float32 math| over max(1, the largest
# output), for sums of 64 products of values in [-1, 1] in any order; bfloat16 outputs are rounded to 8
# significant bits (2^-8 relative), so one unit of them is allowed.
PROBE_TOLERANCE = {"float32": 1e-5, "bfloat16": 2.0**-7}


def dense(x: Any, kernel: Any, bias: Any, gelu: bool = False) -> Any:
    """x @ kernel + bias (+ exact erf GELU) in one oneDNN call; x (tokens, in), kernel (in, out)."""
    attribute, algorithm = ("gelu", "none") if gelu else ("none", "")  # "none": erf, not the tanh form
    x = x if x.dtype == kernel.dtype else x.to(kernel.dtype)  # the float32 residual stream, as `dense` does
    return torch.ops.mkldnn._linear_pointwise(x, kernel.t(), bias, attribute, [], algorithm)


def onednn_linear_problem(device_kind: str, compute_dtype: str, machine: str | None = None) -> str | None:
    """None where `dense` runs here and matches torch's own GEMM; else why not, in a few words."""
    if device_kind != "cpu":
        return f"the device is {device_kind}, not the CPU"
    if compute_dtype not in PROBE_TOLERANCE:
        return f"compute dtype {compute_dtype} (oneDNN's linear is taken for {' and '.join(PROBE_TOLERANCE)})"
    machine = platform.machine() if machine is None else machine
    if machine.lower() not in X86_64:
        return f"the CPU is {machine} (the MKL-or-oneDNN choice is x86-64's)"
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch is built without oneDNN (torch.backends.mkldnn)"
    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, compute_dtype)
    shapes = ((8, 64), (64, 32), (32,))
    x, kernel, bias = ((torch.rand(shape, generator=generator) * 2 - 1).to(dtype) for shape in shapes)
    try:
        with torch.inference_mode():
            got = (dense(x, kernel, bias), dense(x, kernel, bias, gelu=True))
    except Exception as error:  # an op this PyTorch lacks or rejects: its own error types vary
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"torch.ops.mkldnn._linear_pointwise failed ({first_line[:160]})"
    want = torch.addmm(bias.float(), x.float(), kernel.float())  # the same inputs, in float32
    wants = (want, functional.gelu(want))
    scale = max(1.0, float(want.abs().max()))
    difference = max(float((g.float() - w).abs().max()) for g, w in zip(got, wants, strict=True)) / scale
    if got[0].dtype != dtype or difference > PROBE_TOLERANCE[compute_dtype]:
        return f"torch.ops.mkldnn._linear_pointwise is off by {difference:.1e} at {compute_dtype}"
    return None


def addmm_dense(x: Any, kernel: Any, bias: Any, gelu: bool = False) -> Any:
    """x @ kernel + bias (+ exact erf GELU) in the kernel's dtype: one addmm (the bias added by the GEMM
    itself), then torch's own GELU kernel (rounded once in half precision, as the reference's nn.GELU)."""
    x = x if x.dtype == kernel.dtype else x.to(kernel.dtype)
    y = torch.addmm(bias, x, kernel)
    return functional.gelu(y) if gelu else y


def block_forward(
    x: Any,
    keep: Any,
    weights: Sequence[Any],
    *,
    num_heads: int,
    epsilon: float,
    chunk: int | None,
    linear: Callable[..., Any] | None = None,
) -> Any:
    """One post-LN encoder layer in torch ops: `backends.portable.kernels.block_forward`'s math, no Keras
    dispatch.

    x (b, s, H) float32; keep (b, 1, 1, s) bool, True for real keys, or None where no key is padding
    (scaled_dot_product_attention may then take a flash kernel); weights in TransformerBlock.weight_tensors
    order, kernels (in, out) as Keras holds them. `linear` replaces `addmm_dense` (oneDNN's fused linear on an
    x86-64 CPU). Attention `chunk` query rows at a time where given.
    """
    linear = linear or addmm_dense
    (wq, bq, wk, bk, wv, bv, wo, bo, wi, bi, wf, bf, g1, b1, g2, b2) = weights
    b, s, H = x.shape
    d = H // num_heads

    def split_heads(t: Any) -> Any:  # (b * s, H) -> (b, h, s, d), a view
        return t.view(b, s, num_heads, d).transpose(1, 2)

    x = x.reshape(b * s, H)
    q = split_heads(linear(x, wq, bq) * (1.0 / math.sqrt(d)))
    k = split_heads(linear(x, wk, bk))
    v = split_heads(linear(x, wv, bv))
    step = chunk or s
    parts = [
        functional.scaled_dot_product_attention(q[:, :, i : i + step], k, v, attn_mask=keep, scale=1.0)
        for i in range(0, s, step)
    ]
    context = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    context = context.transpose(1, 2).reshape(b * s, H)
    x = functional.layer_norm(x + linear(context, wo, bo).float(), (H,), g1, b1, epsilon)
    ffn = linear(linear(x, wi, bi, gelu=True), wf, bf)
    x = functional.layer_norm(x + ffn.float(), (H,), g2, b2, epsilon)
    return x.view(b, s, H)
