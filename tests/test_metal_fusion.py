"""No fused MatMul + activation on the Metal route, shown on the graph TensorFlow runs after grappler.

tensorflow-metal's fused MatMul + BiasAdd + Relu kernel is reported to give wrong results in graph mode. On
the Metal route the TensorFlow runner calls its tf.functions with grappler's remapper off
(`backends.tensorflow.metal.remapper_off`); the CPU route keeps oneDNN's fused MatMul + BiasAdd + GELU.
Checked here on the post-grappler graphs of the runner's real functions (RunMetadata's
post_optimization_graph) for the tiny checkpoint, all three outputs: an encoder built as on a Mac (device
"metal" on an injected Apple-silicon inventory; TensorFlow, seeing no GPU, places the ops on this CPU, so the
remapper runs its CPU rules, the most it fuses anywhere) against one built for the CPU. On a Mac the plugin's
own graph pass also runs: `plugin_activation_chains` applies its rule to the same graphs. Nothing here ran on
Apple hardware.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from bgem3_embeddings import BGEM3Encoder
from bgem3_embeddings.backends.portable.chunking import LONG_INPUT_CHUNK
from bgem3_embeddings.backends.tensorflow.metal import remapper_off
from bgem3_embeddings.backends.tensorflow.metal_ops import (
    fused_activations,
    optimized_graphs,
    plugin_activation_chains,
)
from bgem3_embeddings.backends.tensorflow.onednn import onednn_enabled
from bgem3_embeddings.devices import DeviceInventory
from bgem3_embeddings.model import OUTPUT_NAMES

MAC = DeviceInventory(gpus=("/physical_device:GPU:0",), platform="Darwin-arm64", macos=(15, 1))
TEXTS = ["What is BGE M3?", "BM25 is a bag-of-words retrieval function that ranks documents", "a"]


def _encoder(checkpoint: Path, device: str, precision: str = "float32") -> BGEM3Encoder:
    return BGEM3Encoder(
        checkpoint,
        precision=precision,
        device=device,
        device_inventory=MAC if device == "metal" else None,
        eager_batches=0,  # the first batch already runs the traced graph
    )


def _run(encoder: BGEM3Encoder) -> tuple[list[Any], dict[str, Any]]:
    """The post-grappler graphs of the runner's function for all three outputs, and its outputs."""
    out: dict[str, Any] = {}

    def call() -> None:
        out.update(encoder.encode(TEXTS, return_sparse=True, return_colbert_vecs=True))

    graphs = optimized_graphs(call)
    assert graphs, "TensorFlow reported no function graph: the function ran before run metadata was on"
    return graphs, out


def _run_long(encoder: BGEM3Encoder) -> list[Any]:
    """The post-grappler graphs of the runner's plain and long-input (chunked attention) functions."""

    def call() -> None:
        for length in (8, LONG_INPUT_CHUNK + 6):
            ids = np.full((2, length), 5, np.int32)
            ids[:, 0], ids[:, -1] = 0, 2
            encoder.runner.run(ids, np.ones_like(ids), OUTPUT_NAMES)

    graphs = optimized_graphs(call)
    assert len(graphs) == 2, "expected the plain and the long-input function"
    return graphs


@pytest.fixture(scope="module")
def routes(tiny_checkpoint: Path) -> Iterator[dict[str, tuple[list[Any], dict[str, Any]]]]:
    metal = _encoder(tiny_checkpoint, "metal")
    assert metal.runner.device.kind == "metal"
    cpu = _encoder(tiny_checkpoint, "cpu")
    metal16 = _encoder(tiny_checkpoint, "metal", "float16")
    yield {"metal": _run(metal), "cpu": _run(cpu), "metal-float16": (_run_long(metal16), {})}


def _ops(graphs: list[Any]) -> set[str]:
    return {n.op for g in graphs for n in list(g.node) + [n for f in g.library.function for n in f.node_def]}


@pytest.mark.parametrize("route", ["metal", "metal-float16"], ids=["float32", "float16-plain-and-long-input"])
def test_the_metal_route_runs_no_fused_matmul_with_an_activation(routes: dict, route: str) -> None:
    graphs, _ = routes[route]
    assert "MatMul" in _ops(graphs) and "Erf" in _ops(graphs)  # the model's graph, GELU unfused
    assert "Relu" in _ops(graphs)  # the sparse head's relu, its own op
    assert [f for g in graphs for f in fused_activations(g)] == []
    # The chain the plugin's own pass would fold (and remapper_off cannot stop) is absent: the sparse head
    # reads its Dense through a Reshape and adds the bias with AddV2 (keras.layers.Dense, units=1).
    assert [c for g in graphs for c in plugin_activation_chains(g)] == []


def test_the_cpu_route_keeps_its_fused_gelu(routes: dict) -> None:
    """The same check on the CPU route finds the fusion: it can fail, and the CPU path did not change."""
    graphs, _ = routes["cpu"]
    fused = [f for g in graphs for f in fused_activations(g)]
    if onednn_enabled():
        assert fused and all("GeluExact" in f for f in fused), fused
    else:  # Eigen's remapper fuses MatMul + BiasAdd only; oneDNN (on by default on x86-64) adds the GELU
        assert fused == [] and "_FusedMatMul" in _ops(graphs)


def test_both_routes_compute_the_same_outputs(routes: dict) -> None:
    (_, metal), (_, cpu) = routes["metal"], routes["cpu"]
    np.testing.assert_allclose(metal["dense_vecs"], cpu["dense_vecs"], atol=1e-5)
    for a, b in zip(metal["lexical_weights"], cpu["lexical_weights"], strict=True):
        assert a.keys() == b.keys() and np.allclose(list(a.values()), list(b.values()), atol=1e-5)
    for a, b in zip(metal["colbert_vecs"], cpu["colbert_vecs"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


# ----------------------------------------------------------------------------- the checks themselves can fail
def _dense_relu(bias_add: bool) -> Any:
    w = tf.Variable(tf.random.stateless_normal([16, 8], seed=(1, 2)))
    b = tf.Variable(tf.random.stateless_normal([8], seed=(3, 4)))

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
    def f(x: tf.Tensor) -> tf.Tensor:
        y = tf.matmul(x, w)
        return tf.nn.relu(tf.nn.bias_add(y, b) if bias_add else y + b)

    return f


def _found(function: Any, x: tf.Tensor) -> tuple[list[str], list[str]]:
    """fused_activations and plugin_activation_chains of the graphs one call of `function` ran."""
    graphs = optimized_graphs(lambda: function(x))
    assert graphs
    activations = [f for g in graphs for f in fused_activations(g)]
    return activations, [c for g in graphs for c in plugin_activation_chains(g)]


def test_the_forum_reproducers_pattern_is_found_and_its_workaround_is_not() -> None:
    """relu(bias_add(matmul)) is what the report says comes out wrong; relu(matmul + b) right."""
    x = tf.ones([4, 16])
    fused = _dense_relu(bias_add=True)
    activations, _ = _found(fused, x)
    assert len(activations) == 1 and "Relu" in activations[0]  # the CPU remapper fuses it
    with remapper_off():  # a new config: TensorFlow optimises the function again
        activations, chains = _found(fused, x)
    assert activations == []
    assert len(chains) == 1  # ... but the plugin's own pass would still fold it
    with remapper_off():
        assert _found(_dense_relu(bias_add=False), x) == ([], [])


def test_remapper_off_is_this_threads_only() -> None:
    """Another thread calling inside the block, and this one after it, keep the process's options."""
    from tensorflow.python.eager import context

    f, x = _dense_relu(bias_add=True), tf.ones([2, 16])
    before = context.context().function_call_options.config_proto_serialized
    seen: list[list[str]] = []

    def other_thread() -> None:
        seen.append(_found(f, x)[0])

    with remapper_off():
        assert context.context().function_call_options.config_proto_serialized != before
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert seen and seen[0], "the other thread lost the remapper"
    assert context.context().function_call_options.config_proto_serialized == before
