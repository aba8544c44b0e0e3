"""The op check: every op our inference graphs compute with has a kernel on the Apple GPU under
tensorflow-metal-plugin, so the whole forward pass can stay on the GPU.

Against the pinned registration lists in tests/data/metal_plugin_kernels.json (the plugin's own, read from its
sdist, and TensorFlow's DEVICE_DEFAULT kernels; regenerate with tools/metal_plugin_kernels.py), for the graphs
as an encoder builds them on a Metal device: the tiny checkpoint loaded with device="metal" on an injected
Apple-silicon inventory (TensorFlow, seeing no GPU here, places the ops on the CPU; the graph is the one a Mac
would run). float32 and float16, all outputs and each head alone, plain and long-input (chunked) attention,
the eager path's ops, and the SavedModel export. Nothing here ran on Apple hardware.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from bgem3_embeddings import BGEM3Encoder
from bgem3_embeddings.backends.portable.chunking import LONG_INPUT_CHUNK
from bgem3_embeddings.backends.tensorflow.metal import PLUGIN_TF
from bgem3_embeddings.backends.tensorflow.metal_ops import (
    KernelLists,
    OpUse,
    Placement,
    graph_op_uses,
    place,
    place_all,
)
from bgem3_embeddings.batching import pad_batch
from bgem3_embeddings.devices import DeviceInventory
from bgem3_embeddings.model import OUTPUT_NAMES
from tests.reference_m3 import ReferenceM3, assert_batch_matches_reference

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "tests" / "data" / "metal_plugin_kernels.json"
MAC = DeviceInventory(gpus=("/physical_device:GPU:0",), platform="Darwin-arm64", macos=(15, 1))
TEXTS = ["What is BGE M3?", "", "BM25 is a bag-of-words retrieval function that ranks documents", "a"]


@pytest.fixture(scope="module")
def kernels() -> KernelLists:
    return KernelLists.load(KERNELS)


@pytest.fixture(scope="module", params=["float32", "float16"])
def metal_encoder(request: pytest.FixtureRequest, tiny_checkpoint: Path) -> Iterator[BGEM3Encoder]:
    """An encoder built as on a Mac with the plugin: device "metal", weights ported, not mapped."""
    if tuple(int(v) for v in tf.__version__.split(".")[:2]) != PLUGIN_TF:
        pytest.skip(f"the plugin runs on TensorFlow {PLUGIN_TF}, not {tf.__version__}: not its graphs")
    # The device kind ("metal") comes from the injected inventory; loading reads it from there.
    encoder = BGEM3Encoder(
        tiny_checkpoint,
        precision=request.param,
        device="metal",
        device_inventory=MAC,
        weights_cache=False,  # port the checkpoint: the load path a first run on a Mac takes
        eager_batches=0,
    )
    yield encoder


@pytest.fixture(scope="module")
def ported_cpu_encoder(tiny_checkpoint: Path) -> BGEM3Encoder:
    """The CPU load that ports the checkpoint (row-block writes): not the session's tiny_encoder, which maps
    the converted-weights cache whenever an earlier test of the session wrote it."""
    return BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu", weights_cache=False)


def leaving_gpu(graph_def: Any, kernels: KernelLists) -> list[str]:
    return [
        f"{p.use.describe()} -> {p.where} ({p.use.count}x, e.g. {p.use.example})"
        for p in place_all(graph_op_uses(graph_def), kernels)
        if p.leaves_gpu
    ]


# ------------------------------------------------------------------------------------------ the pinned lists
def test_pinned_lists_name_what_they_read(kernels: KernelLists) -> None:
    data = json.loads(KERNELS.read_text(encoding="utf-8"))
    plugin = data["plugin"]
    assert plugin["name"] == "tensorflow-metal-plugin" and len(plugin["sdist_sha256"]) == 64
    assert plugin["ops"] == len({k["op"] for k in plugin["kernels"]}) > 200
    # The doctor's pin (bgem3_embeddings/backends/tensorflow/metal.py) is the TensorFlow this plugin version
    # was read for.
    assert tuple(int(v) for v in kernels.tensorflow_pin.split(".")[:2]) == PLUGIN_TF
    assert kernels.tensorflow_default_version.startswith(f"{PLUGIN_TF[0]}.{PLUGIN_TF[1]}.")
    assert all(k["constraints"] for k in kernels.plugin if k["op"] in ("MatMul", "Erf", "GatherV2"))


def test_pinned_defaults_match_the_installed_tensorflow(kernels: KernelLists) -> None:
    """TensorFlow's own DEVICE_DEFAULT kernels, as pinned, are the installed TensorFlow's (same version)."""
    if tf.__version__ != kernels.tensorflow_default_version:
        pytest.skip(
            f"the list was read from TensorFlow {kernels.tensorflow_default_version}, not {tf.__version__}"
        )
    from tensorflow.python.framework import kernels as registry

    ops = {"ReadVariableOp", "Reshape", "Identity", "StatelessWhile", "TensorListGetItem", "AddV2"}
    live = sorted(
        (k.op, sorted(k.host_memory_arg))
        for k in registry.get_all_registered_kernels().kernel
        if k.device_type == "DEFAULT" and k.op in ops
    )
    pinned = sorted((k["op"], k["host_memory"]) for k in kernels.default if k["op"] in ops)
    assert live == pinned


# ---------------------------------------------------------------------------- the check itself can fail
def test_the_check_names_ops_without_a_metal_kernel(kernels: KernelLists) -> None:
    """int32 arithmetic on the inputs and Erfc have no Metal kernel; shape arithmetic does not count."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.float32)])
    def graph(ids: tf.Tensor, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        positions = tf.cumsum(ids, axis=1) * ids  # int32 data: Cumsum has no kernel, Mul a host one
        width = tf.shape(ids)[1] * 2 + 1  # int32 shape arithmetic: on the host under every backend
        return (
            positions,
            tf.math.erfc(x) + tf.math.erf(x),
            tf.reshape(x, [-1, 1]) * tf.cast(width, tf.float32),
        )

    placements = {
        (p.use.op, dict(p.use.dtypes).get("T")): p
        for p in place_all(graph_op_uses(graph.get_concrete_function().graph.as_graph_def()), kernels)
    }
    assert placements[("Cumsum", "int32")].where == "cpu"
    assert placements[("Mul", "int32")].where == "host"
    assert placements[("Erfc", "float32")].where == "cpu"
    assert placements[("Erf", "float32")].where == "metal"
    assert placements[("Reshape", "float32")].where == "tensorflow"
    # The shape path (Shape, then int32 AddV2/Mul on it) is not listed: only the data path counts.
    assert "Shape" not in {op for op, _ in placements} and ("AddV2", "int32") not in placements


def test_placement_follows_tensorflows_kernel_matching(kernels: KernelLists) -> None:
    def use(op: str, **dtypes: str) -> Placement:
        return place(OpUse(op, tuple(sorted(dtypes.items())), ("x", "y", "z"), 1, op), kernels)

    assert use("MatMul", T="float16").where == "metal"
    assert use("MatMul", T="bfloat16").where == "cpu"  # the plugin has no bf16 matmul
    assert use("Cast", SrcT="float32", DstT="int32").where == "metal"
    assert use("GatherV2", Tparams="float32", Tindices="int32", Taxis="int32").kernel.startswith(
        "MetalGather"
    )
    assert (
        use("ResourceGather", dtype="float32", Tindices="int32").where == "cpu"
    )  # needs the C API 2.21 lacks


# ------------------------------------------------------------------------------- our graphs on the Apple GPU
@pytest.mark.parametrize("long_input", [False, True], ids=["plain-attention", "chunked-attention"])
def test_inference_graphs_stay_on_the_gpu(
    metal_encoder: BGEM3Encoder, kernels: KernelLists, long_input: bool
) -> None:
    function: Any = metal_encoder.inference_function(OUTPUT_NAMES, long_input=long_input)  # a tf.function
    graph = function.get_concrete_function().graph.as_graph_def()
    uses = graph_op_uses(graph)
    ops = {u.op for u in uses}
    # The graph is the one described: matmuls in the compute dtype, the three heads, the while loop if long.
    assert {"MatMul", "BatchMatMulV2", "Softmax", "Erf", "GatherV2", "Relu", "Cumsum"} <= ops
    assert ("StatelessWhile" in ops) == long_input
    matmul_dtypes = {dict(u.dtypes)["T"] for u in uses if u.op == "MatMul"}
    assert matmul_dtypes == {metal_encoder.compute_dtype}
    assert leaving_gpu(graph, kernels) == []


@pytest.mark.parametrize("output", OUTPUT_NAMES)
def test_each_head_alone_stays_on_the_gpu(
    metal_encoder: BGEM3Encoder, kernels: KernelLists, output: str
) -> None:
    function: Any = metal_encoder.inference_function((output,))
    graph = function.get_concrete_function().graph.as_graph_def()
    assert leaving_gpu(graph, kernels) == []


def test_the_eager_path_uses_the_same_ops(metal_encoder: BGEM3Encoder, kernels: KernelLists) -> None:
    """The first short batches run eagerly, op by op, without the shared layer function: the same model
    code, traced here to list its ops."""
    model = metal_encoder.model
    spec = tf.TensorSpec([None, None], tf.int32)
    eager_ops = tf.function(lambda ids, mask: model({"input_ids": ids, "attention_mask": mask}))
    graph = eager_ops.get_concrete_function(spec, spec).graph.as_graph_def()
    assert leaving_gpu(graph, kernels) == []


def test_metal_load_reads_whole_tables(metal_encoder: BGEM3Encoder, ported_cpu_encoder: Any) -> None:
    """On Metal the tables are written whole (no row-block writes, which have no kernel there) and read then
    gathered (no ResourceGather); the weights are the CPU load's."""
    assert metal_encoder.model.embeddings.gather_from_variables is False
    assert ported_cpu_encoder.model.embeddings.gather_from_variables is True  # the CPU load writes row blocks
    ours = metal_encoder.model.embeddings.word_embeddings.embeddings.numpy()
    theirs = ported_cpu_encoder.model.embeddings.word_embeddings.embeddings.numpy().astype(ours.dtype)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("side", ["right", "left"])
def test_metal_graphs_match_the_reference(
    metal_encoder: BGEM3Encoder, tiny_checkpoint: Path, side: str
) -> None:
    """The changed graph (float index arithmetic, erf GELU, whole tables) against the reference, on both
    padding sides, plain and chunked attention; both sides run one traced graph."""
    if metal_encoder.compute_dtype != "float32":
        pytest.skip("the float16 graph's accuracy is covered by tests/test_precision.py")
    reference = ReferenceM3(tiny_checkpoint)
    token_ids = reference.tokenizer(TEXTS)["input_ids"]
    # Row 2 repeated past LONG_INPUT_CHUNK tokens: the long-input graph's chunked attention runs on it.
    token_ids[2] = token_ids[2] * (LONG_INPUT_CHUNK // len(token_ids[2]) + 2)
    assert len(token_ids[2]) > LONG_INPUT_CHUNK
    ref = reference.encode_ids(token_ids)
    for long_input in (False, True):
        rows = [0, 1, 3] if not long_input else [0, 2]
        ids, mask = pad_batch([token_ids[r] for r in rows], metal_encoder.config.pad_token_id, side)
        out = metal_encoder.inference_function(OUTPUT_NAMES, long_input=long_input)(ids, mask)
        out = {k: np.asarray(v) for k, v in out.items()}
        subset = {k: [v[r] for r in rows] for k, v in ref.items()}
        assert_batch_matches_reference(out, ids, mask, subset)
    functions: tuple[Any, ...] = (
        metal_encoder.inference_function(OUTPUT_NAMES),
        metal_encoder.inference_function(OUTPUT_NAMES, long_input=True),
    )
    assert [f.experimental_get_tracing_count() for f in functions] == [1, 1]


def test_saved_model_stays_on_the_gpu(
    metal_encoder: BGEM3Encoder, ported_cpu_encoder: Any, kernels: KernelLists, tmp_path: Path
) -> None:
    """The export reads the tables then gathers, whatever the exporting encoder does (a loaded SavedModel
    restores each variable whole); checked on the loaded signature's graph."""
    from bgem3_embeddings.export.saved_model import export_saved_model

    exporter = ported_cpu_encoder if metal_encoder.precision == "float32" else metal_encoder
    out = export_saved_model(exporter, tmp_path / "saved")
    graph = tf.saved_model.load(str(out)).signatures["serving_default"].graph.as_graph_def()
    assert "ResourceGather" not in {u.op for u in graph_op_uses(graph)}
    assert leaving_gpu(graph, kernels) == []
    assert ported_cpu_encoder.model.embeddings.gather_from_variables is True  # the exporter's mode is kept


# -------------------------------------------------------------------------------- the regeneration script
def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "metal_plugin_kernels", ROOT / "tools" / "metal_plugin_kernels.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FAKE_KERNELS = r"""
// A registration file in the plugin's style: a helper with a braced default argument, a dtype table,
// function pointers (a template among them) and a group registered only with the resource-variable C API.
namespace tensorflow { namespace metal {
namespace {
void Register(const char* op, void (*compute)(void*, TF_OpKernelContext*), TF_DataType dtype,
              const std::string& name, std::vector<const char*> host = {"axis"}) {
  TF_Status* status = TF_NewStatus();
  TF_KernelBuilder* b = TF_NewKernelBuilder(op, kMetalDeviceType, nullptr, compute, nullptr);
  TF_KernelBuilder_TypeConstraint(b, "T", dtype, status);
  for (const char* a : host) TF_KernelBuilder_HostMemory(b, a);
  TF_RegisterKernelBuilder(name.c_str(), b, status);
  TF_DeleteStatus(status);
}
}  // namespace
void RegisterMetalFakeKernels() {
  static constexpr TF_DataType kDTypes[] = {TF_FLOAT, TF_HALF};
  static constexpr const char* kSuffixes[] = {"Float", "Half"};
  for (int i = 0; i < 2; ++i) {
    Register("Cumsum", &Scan_Compute<false>, kDTypes[i], std::string("MetalCumsum") + kSuffixes[i]);
  }
}
void RegisterMetalResourceKernels() { Register("ResourceGather", &Gather_Compute, TF_FLOAT, "MetalRG", {}); }
void RegisterAllMetalKernels() {
  RegisterMetalFakeKernels();
  if (ResourceVariableApiAvailable()) { RegisterMetalResourceKernels(); }
}
} }
"""


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("resource_api", [False, True])
def test_regeneration_compiles_the_registration_code(tmp_path: Path, resource_api: bool) -> None:
    tool = _tool()
    source = tmp_path / "kernels"
    source.mkdir()
    (source / "metal_fake_ops.mm").write_text(FAKE_KERNELS, encoding="utf-8")
    work = tmp_path / "build"
    work.mkdir()
    lines = tool.compile_and_run(source, tf.sysconfig.get_include(), resource_api, work)
    found = tool.parse_registrations(lines, lambda v: tf.dtypes.as_dtype(v).name)
    expected = [
        {
            "kernel": "MetalCumsumFloat",
            "op": "Cumsum",
            "constraints": [["T", "float32"]],
            "host_memory": ["axis"],
        },
        {
            "kernel": "MetalCumsumHalf",
            "op": "Cumsum",
            "constraints": [["T", "float16"]],
            "host_memory": ["axis"],
        },
    ]
    if resource_api:
        expected.append(
            {
                "kernel": "MetalRG",
                "op": "ResourceGather",
                "constraints": [["T", "float32"]],
                "host_memory": [],
            }
        )
    assert found == expected
