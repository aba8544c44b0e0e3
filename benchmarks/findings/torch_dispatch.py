"""Ours on Keras' PyTorch backend, three ways in one process: what dispatching each op costs beside its math.

- `keras layers`: the Keras model called as a Keras user calls it (`model(inputs)`): every layer's
  __call__ and keras.ops, the projections as torch.matmul + add;
- `torch ops`: the PyTorch runner's layers (`backends.torch.kernels.block_forward`: the same math in
  torch ops, weights held, no Keras in between), the projections as torch.addmm;
- `torch ops + oneDNN`: the same with oneDNN's fused linear (`backends.torch.kernels.dense`), what the
  runner takes on an x86-64 CPU (absent where `onednn_linear_problem` finds it does not run).

Per shape, ms per call (best of --repeats after a warm-up; dense output to the host) and each row's speed
against the Keras layers. The tiny checkpoint's two small layers are nearly all dispatch, so its per-layer
difference is what eager dispatch costs per layer; the full-size rows show what it weighs beside the math.
Max |dense - keras layers' dense| per row says the three computed the same thing (parity with the
reference is tests/test_backends.py's).

    python benchmarks/findings/torch_dispatch.py --model CHECKPOINT --shapes 1x16,8x128
    python benchmarks/findings/torch_dispatch.py --tiny
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import gpu_check  # noqa: E402  (benchmarks/gpu_check.py: the shapes option, full rows of random ids)
from torch_onednn_linear import best_s  # noqa: E402  (best of --repeats after a warm-up)


def row_calls(encoder: Any) -> dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """Each row's call: (ids, mask) -> dense vectors on the host."""
    import keras
    import torch

    runner, model = encoder.runner, encoder.runner.model
    addmm_block = functools.partial(runner.block, linear=None)  # the runner's layer, addmm for projections

    def keras_layers(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            inputs = {"input_ids": ids.astype(np.int32), "attention_mask": mask.astype(np.int32)}
            return keras.ops.convert_to_numpy(model(inputs, outputs=("dense_vecs",))["dense_vecs"])

    def runner_with(block: Any) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        def call(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            chosen, runner.block = runner.block, block
            try:
                return np.asarray(runner.run(ids, mask, ("dense_vecs",))["dense_vecs"])
            finally:
                runner.block = chosen

        return call

    calls = {"keras layers": keras_layers, "torch ops": runner_with(addmm_block)}
    if runner.linear is not None:
        calls["torch ops + oneDNN"] = runner_with(runner.block)
    return calls


def measure(args: argparse.Namespace) -> str:
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import torch

    from bgem3_embeddings import BGEM3Encoder

    if keras.backend.backend() != "torch":
        raise SystemExit(f"Keras runs on {keras.backend.backend()}, not torch")
    encoder = BGEM3Encoder(str(args.model), precision=args.precision, device="cpu", weights_cache=False)
    config = encoder.config
    calls = row_calls(encoder)
    lines = [
        f"torch_dispatch: torch {torch.__version__}, keras {keras.__version__}, {torch.get_num_threads()} "
        f"threads; {config.num_hidden_layers} layers of hidden {config.hidden_size}; {args.precision}; "
        f"oneDNN linear: {encoder.runner.linear_problem or 'taken here'}",
        f"{'shape':<8} {'row':<20} {'ms / call':>10} {'x keras layers':>15} {'ms saved / layer':>17} "
        f"{'max |d dense|':>14}",
    ]
    for rows, length in args.shapes:
        ids, mask = gpu_check.timing_batch(config.vocab_size, rows, length)
        reference = calls["keras layers"](ids, mask)
        times = {
            name: 1e3 * best_s(functools.partial(call, ids, mask), args.repeats)
            for name, call in calls.items()
        }
        base = times["keras layers"]
        for name, call in calls.items():
            ms = times[name]
            gap = float(np.abs(call(ids, mask) - reference).max())
            saved = (base - ms) / config.num_hidden_layers
            lines.append(f"{f'{rows}x{length}':<8} {name:<20} {ms:>10.2f} {base / ms:>14.2f}x {saved:>17.3f} "
                         f"{gap:>14.1e}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a checkpoint folder (default with --tiny: one generated)")
    parser.add_argument("--tiny", action="store_true", help="the tiny random checkpoint (generated)")
    parser.add_argument(
        "--shapes",
        type=lambda text: gpu_check.parse_shapes(text, smallest=1),  # a lone query is a shape here
        default=None,
        help="BATCHxLENGTH,... (default 1x16,8x128)",
    )
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    if args.model is None and not args.tiny:
        parser.error("give --model CHECKPOINT, or --tiny")
    args.shapes = args.shapes or [(1, 16), (8, 128)]
    with tempfile.TemporaryDirectory(prefix="torch-dispatch-") as tmp:
        if args.model is None:
            from tests.tiny_checkpoint import make_tiny_checkpoint

            args.model = make_tiny_checkpoint(Path(tmp) / "checkpoint")
        print(measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
