"""One BGE-M3 FFN-in matmul, (tokens, 1024) @ (1024, 4096) + bias, in each engine the bench compares.

    python benchmarks/int8_gemm.py --tokens 1024
    python benchmarks/findings/avx2_dispatch/run.py -- python benchmarks/int8_gemm.py   # the AVX2 kernels

Rows: TensorFlow float32 (oneDNN), TFLite + XNNPACK dynamic-range int8 (what precision="int8" runs: int8
weights per output channel, activations quantized per batch on the fly), ONNX Runtime float32 and
dynamic int8 (quantize_dynamic, per-channel int8 weights: what `bgem3 bench` exports). Prints the best
of --repeats runs in ms and GFLOP/s (int8: GOP/s), and each engine's error against float64 numpy.
Separates the int8 GEMM kernels from everything else a whole-model run measures.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import bgem3_embeddings  # noqa: F401  - before TensorFlow: sets the oneDNN default

IN, OUT = 1024, 4096


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of `fn` after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def tensorflow_dense(kernel: np.ndarray, bias: np.ndarray) -> Any:
    """A tf.Module with one traced matmul + bias (dynamic token count)."""
    import tensorflow as tf

    class Dense(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kernel = tf.Variable(kernel)
            self.bias = tf.Variable(bias)

        @tf.function(input_signature=[tf.TensorSpec([None, kernel.shape[0]], tf.float32)])
        def __call__(self, x: Any) -> Any:
            return tf.matmul(x, self.kernel) + self.bias

    return Dense()


def tflite_int8(module: Any, tokens: int, threads: int) -> Callable[[np.ndarray], np.ndarray]:
    """The module converted with dynamic-range quantization, run by TFLite's interpreter (XNNPACK)."""
    import tensorflow as tf

    from bgem3_embeddings.export.tflite import _interpreter_class

    function = module.__call__.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], module)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice (LiteRT); it works
        interpreter = _interpreter_class()(model_content=converter.convert(), num_threads=threads)
    index = interpreter.get_input_details()[0]["index"]
    interpreter.resize_tensor_input(index, [tokens, module.kernel.shape[0]])
    interpreter.allocate_tensors()
    output = interpreter.get_output_details()[0]["index"]

    def run(x: np.ndarray) -> np.ndarray:
        interpreter.set_tensor(index, x)
        interpreter.invoke()
        return interpreter.get_tensor(output)

    return run


def onnxruntime_sessions(
    kernel: np.ndarray, bias: np.ndarray, folder: Path, threads: int
) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """ONNX Runtime float32 and dynamic int8 (per-channel int8 weights) sessions of the same layer."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, kernel.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, kernel.shape[1]])],
        [numpy_helper.from_array(kernel, "w"), numpy_helper.from_array(bias, "b")],
    )
    fp32 = folder / "dense.onnx"
    int8 = folder / "dense-int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), fp32)
    quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8, per_channel=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    runs = {}
    for name, path in (("onnxruntime float32", fp32), ("onnxruntime int8", int8)):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runs[name] = lambda x, s=session: s.run(None, {"x": x})[0]
    return runs


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--in-features", type=int, default=IN)
    parser.add_argument("--out-features", type=int, default=OUT)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="default: the CPUs this process may use")
    args = parser.parse_args(argv)
    # TFLite's default is one thread; the other engines use every core. Same count for all of them.
    threads = args.threads or len(os.sched_getaffinity(0))

    rng = np.random.default_rng(0)
    kernel = (rng.standard_normal((args.in_features, args.out_features)) * 0.02).astype(np.float32)
    bias = (rng.standard_normal(args.out_features) * 0.02).astype(np.float32)
    x = rng.standard_normal((args.tokens, args.in_features)).astype(np.float32)
    reference = x.astype(np.float64) @ kernel + bias
    module = tensorflow_dense(kernel, bias)
    runs: dict[str, Callable[[np.ndarray], Any]] = {
        "tensorflow float32": lambda v: module(v).numpy(),
        "tflite-xnnpack int8": tflite_int8(module, args.tokens, threads),
    }
    with tempfile.TemporaryDirectory(prefix="bgem3-int8-gemm-") as tmp:
        try:
            runs.update(onnxruntime_sessions(kernel, bias, Path(tmp), threads))
        except ImportError as error:
            print(f"onnxruntime rows skipped: {error}")
        ops = 2.0 * args.tokens * args.in_features * args.out_features
        results = {}
        print(f"(tokens {args.tokens}) @ ({args.in_features}, {args.out_features}), {threads} threads, "
              f"best of {args.repeats}")
        for name, run in runs.items():
            seconds = best_seconds(lambda r=run: r(x), args.repeats)
            error = float(np.abs(np.asarray(run(x)) - reference).max() / np.abs(reference).max())
            results[name] = {"ms": seconds * 1e3, "gops": ops / seconds / 1e9, "max_rel_error": error}
            print(f"  {name:22s} {seconds * 1e3:8.1f} ms {ops / seconds / 1e9:8.0f} G(FL)OP/s  "
                  f"max error / max |y| {error:.1e}")
    return results


if __name__ == "__main__":
    main()
