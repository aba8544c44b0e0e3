"""Device and precision choice, doctor lines and known problems per Keras backend, with injected
inventories: the Apple GPU through PyTorch's MPS, CUDA on JAX and PyTorch, tested on a CPU-only machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bgem3_embeddings.backends.keras_backend import (
    BackendFeatureError,
    configured_backend,
    require_tensorflow,
)
from bgem3_embeddings.devices import (
    DeviceChoice,
    DeviceError,
    DeviceInventory,
    choose_device,
    choose_precision,
    keras_device_name,
)
from bgem3_embeddings.doctor import (
    attention_lines,
    auto_lines,
    backend_lines,
    cpu_problems,
    known_problems,
    projection_lines,
)
from tests.optional import require_module

MAC = "Darwin-arm64"
LINUX = "Linux-x86_64"


def test_the_apple_gpu_through_pytorch_mps() -> None:
    mac = DeviceInventory(gpus=("mps",), platform=MAC, backend="torch", backend_version="2.13.0")
    device = choose_device("auto", mac)
    assert device.kind == "metal"
    assert keras_device_name(device, "torch") == "mps"
    assert choose_device("metal", mac) == device
    # float32 on the Apple GPU, as on the Metal routes: fp16 is the reference's choice on CUDA only.
    assert choose_precision("auto", device) == "float32"
    assert "auto choice: device metal (mps)" in auto_lines(mac)[0]


def test_cuda_on_jax_and_pytorch() -> None:
    for backend, name in (("torch", "cuda:1"), ("jax", "gpu:1")):
        box = DeviceInventory(gpus=(f"{backend}-0", f"{backend}-1"), platform=LINUX, backend=backend)
        device = choose_device("/GPU:1", box)
        assert device.kind == "cuda" and keras_device_name(device, backend) == name
        assert choose_precision("auto", choose_device("auto", box)) == "float16"


def test_doctor_says_which_attention_jax_runs_on_cuda() -> None:
    box = DeviceInventory(gpus=("jax-0",), platform=LINUX, backend="jax")
    lines = attention_lines(box, lambda kind, dtype: None if dtype == "bfloat16" else "cuDNN too old")
    assert lines == [
        "attention on JAX (CUDA):",
        "  bfloat16: cuDNN flash attention (right-padded batches up to 1,024 tokens)",
        "  float16: XLA, slower: cuDNN too old",
    ]
    # Not asked where it cannot apply: another backend, or no GPU.
    assert attention_lines(DeviceInventory(gpus=("torch-0",), platform=LINUX, backend="torch")) == []
    assert attention_lines(DeviceInventory(platform=LINUX, backend="jax")) == []


def test_doctor_says_how_pytorch_runs_its_projections_on_the_cpu() -> None:
    cpu = DeviceInventory(platform=LINUX, backend="torch")
    assert projection_lines(cpu, lambda kind, dtype: None) == [
        "projections on PyTorch (CPU, float32): oneDNN's fused linear (+ GELU)"
    ]
    slow = projection_lines(cpu, lambda kind, dtype: "the CPU is arm64")
    assert slow == ["projections on PyTorch (CPU, float32): torch.matmul: the CPU is arm64"]
    assert projection_lines(DeviceInventory(platform=LINUX, backend="jax")) == []
    assert projection_lines(DeviceInventory(gpus=("cuda:0",), platform=LINUX, backend="torch")) == []


def test_cpu_names_per_backend() -> None:
    cpu = DeviceChoice("cpu", "/CPU:0")
    assert [keras_device_name(cpu, b) for b in ("tensorflow", "jax", "torch")] == ["/CPU:0", "cpu:0", "cpu"]


def test_no_gpu_names_the_backend_and_the_way_out() -> None:
    with pytest.raises(DeviceError, match="PyTorch sees no GPU.*mps.is_available"):
        choose_device("metal", DeviceInventory(platform=MAC, backend="torch"))
    with pytest.raises(DeviceError, match="JAX sees no GPU.*KERAS_BACKEND=torch"):
        choose_device("metal", DeviceInventory(platform=MAC, backend="jax"))
    with pytest.raises(DeviceError, match="Apple GPU runs on Keras' TensorFlow or PyTorch"):
        keras_device_name(DeviceChoice("metal", "/GPU:0"), "jax")


def test_known_problems_per_backend() -> None:
    versions = {"tensorflow": None, "keras": "3.15.1", "torch": "2.13.0", "jax": None}

    def messages(**kwargs: object) -> str:
        args = {"versions": versions, "platform_name": MAC, "python": (3, 13), **kwargs}
        return " | ".join(f"{p.severity}: {p.message}" for p in known_problems(**args))  # type: ignore[arg-type]

    on_torch = messages(backend="torch", gpus=("mps",))
    assert "keras-team/keras#23700" in on_torch and "the encoder is not affected" in on_torch
    assert "need the TensorFlow backend" in on_torch
    # No TensorFlow installed is no problem off its backend; the Metal plugins' rules do not apply there.
    assert "tensorflow is not installed" not in on_torch and "Metal backend" not in on_torch
    on_jax = messages(backend="jax")
    assert "error: KERAS_BACKEND=jax but jax is not installed" in on_jax and "jax-metal" in on_jax
    on_tf = messages(backend="tensorflow")
    assert "error: tensorflow is not installed" in on_tf
    # a bf16 CPU: slower than float32 on JAX's CPU backend, said there only
    zen5 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
    def said(backend: str, gpus: tuple[str, ...] = ()) -> bool:
        found = cpu_problems(zen5, gpus, "Linux-x86_64", backend)
        slower = "JAX on this CPU: precision='bfloat16' runs slower than float32"
        return any(slower in p.message for p in found)

    assert said("jax") and not said("torch") and not said("tensorflow") and not said("jax", ("cuda:0",))


def test_backend_lines_say_where_the_choice_came_from() -> None:
    box = DeviceInventory(backend="jax", backend_version="0.10.2")
    expected = "keras backend: jax 0.10.2 (JAX; from KERAS_BACKEND=jax)"
    assert backend_lines(box, {"KERAS_BACKEND": "jax"})[0] == expected
    assert "keras.json" in backend_lines(box, {})[0]


def test_configured_backend_reads_what_keras_reads(tmp_path: Path) -> None:
    assert configured_backend({"KERAS_BACKEND": "torch"}) == "torch"
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "jax"}))
    assert configured_backend({"KERAS_HOME": str(tmp_path)}) == "jax"
    (tmp_path / "keras.json").write_text("not json")
    assert configured_backend({"KERAS_HOME": str(tmp_path)}) == "tensorflow"
    assert configured_backend({"KERAS_HOME": str(tmp_path / "none")}) == "tensorflow"


def test_tensorflow_only_features_say_which_backend_they_need() -> None:
    require_tensorflow("export")  # this process runs TensorFlow
    with pytest.raises(BackendFeatureError, match=r"export needs Keras' TensorFlow backend.*Keras on jax"):
        require_tensorflow("export", backend="jax")


@pytest.mark.parametrize(
    ("backend", "args", "feature"),
    [("jax", ["export", "OUT"], "bgem3 export"), ("torch", ["encode", "hi", "--precision", "int8"], "int8")],
)
def test_commands_say_in_one_line_which_backend_a_feature_needs(
    tiny_checkpoint: Path, tmp_path: Path, backend: str, args: list[str], feature: str
) -> None:
    import os
    import subprocess
    import sys

    require_module(backend)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    env = {**os.environ, "KERAS_BACKEND": backend}
    done = subprocess.run(
        [sys.executable, "-m", "bgem3_embeddings.cli", *argv, "--model", str(tiny_checkpoint)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and feature in lines[0] and "KERAS_BACKEND=tensorflow" in lines[0], done.stderr
    assert not (tmp_path / "out").exists()
