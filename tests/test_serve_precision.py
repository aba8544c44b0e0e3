"""`bgem3 serve --precision auto`: bfloat16 on a CPU with bf16 matmuls, float32 on other CPUs (widening bf16
weights at every call would slow a lone query), the library's choice on GPUs, and one start-up line that says
what it chose and why (devices.choose_serve_precision; the figures behind it are in
docs/performance/serve.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bgem3_embeddings.devices import (
    DeviceChoice,
    DeviceInventory,
    choose_serve_precision,
    resolve_serve_precision,
)
from tests.optional import require_module

CPU = DeviceChoice("cpu", "/CPU:0")
AVX2 = frozenset({"avx", "avx2", "fma"})
CASCADE_LAKE = AVX2 | {"avx512f", "avx512_vnni"}  # int8 dot products, no bf16
ZEN4 = AVX2 | {"avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni"}
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_int8", "amx_tile"}


@pytest.mark.parametrize(
    ("flags", "precision", "says"),
    [
        (AVX2, "float32", "without bf16 matmuls"),
        (CASCADE_LAKE, "float32", "without bf16 matmuls"),
        (ZEN4, "bfloat16", "avx512_bf16"),
        (SAPPHIRE_RAPIDS, "bfloat16", "amx_bf16 and avx512_bf16"),
    ],
)
def test_auto_serves_bf16_where_the_cpu_multiplies_in_bf16(
    flags: frozenset[str], precision: str, says: str
) -> None:
    choice = choose_serve_precision(CPU, flags)
    assert (choice.precision, choice.compute_dtype) == (precision, precision)
    assert says in choice.reason
    # int8 is named where the CPU has int8 dot products (VNNI, AMX-INT8), never chosen
    assert ("--precision int8" in choice.reason) == bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def test_auto_serves_float32_on_jax_cpus_where_bf16_is_slower() -> None:
    """JAX's CPU backend uses no bf16 instructions (0.75x its float32 on a Zen 5, docs/performance.md):
    float32 there, bf16 on the same CPU under TensorFlow and PyTorch; int8 named under TensorFlow only."""
    on_jax = choose_serve_precision(CPU, ZEN4, "jax")
    assert (on_jax.precision, on_jax.compute_dtype) == ("float32", "float32")
    assert "JAX on the CPU" in on_jax.reason and "--precision int8" not in on_jax.reason
    on_torch = choose_serve_precision(CPU, ZEN4, "torch")
    assert on_torch.precision == "bfloat16" and "--precision int8" not in on_torch.reason
    assert "--precision int8" in choose_serve_precision(CPU, ZEN4, "tensorflow").reason
    inventory = DeviceInventory(platform="Linux-x86_64", cpu_flags=SAPPHIRE_RAPIDS, backend="jax")
    assert resolve_serve_precision("auto", "cpu", inventory)[0] == "float32"


@pytest.mark.parametrize(("kind", "precision"), [("cuda", "float16"), ("metal", "float32")])
def test_auto_keeps_the_library_choice_on_gpus(kind: str, precision: str) -> None:
    choice = choose_serve_precision(DeviceChoice(kind, "/GPU:0"), SAPPHIRE_RAPIDS)
    assert (choice.precision, choice.compute_dtype) == (precision, precision)
    assert kind in choice.reason


def test_resolve_keeps_an_explicit_precision_and_explains_auto() -> None:
    inventory = DeviceInventory(platform="Linux-x86_64", cpu_flags=CASCADE_LAKE)
    for explicit in ("float32", "bfloat16", "int8"):
        assert resolve_serve_precision(explicit, "auto", inventory) == (explicit, None)
    precision, reason = resolve_serve_precision("auto", "cpu", inventory)
    assert precision == "float32" and reason is not None and "--precision int8" in reason
    gpu = DeviceInventory(gpus=("/physical_device:GPU:0",), platform="Linux-x86_64", cpu_flags=ZEN4)
    assert resolve_serve_precision("auto", "auto", gpu)[0] == "float16"
    assert resolve_serve_precision("auto", "cpu", gpu)[0] == "bfloat16"  # --device cpu beside a GPU


def test_serve_says_what_auto_chose_and_serves_it(tiny_checkpoint: Path) -> None:
    """As a user starts it: `bgem3 serve` with no --precision prints its choice for this machine's CPU,
    /v1/bgem3/info reports it, and the vectors stay within bf16 rounding of the reference's."""
    require_module("fastapi", reason="the server needs the serve extra")
    import httpx

    from bgem3_embeddings.devices import read_cpu_flags
    from bgem3_embeddings.encoder import BGEM3Encoder
    from tests.command_server import started_command
    from tests.reference_m3 import ReferenceM3

    args = [
        "-m",
        "bgem3_embeddings.cli",
        "serve",
        "--port",
        "0",
        "--device",
        "cpu",
        "--model",
        str(tiny_checkpoint),
    ]
    with started_command(args, "stderr", first_path="/health") as (_, url, lines):
        said = [line for line in lines if "--precision auto" in line]
        info = httpx.get(url + "/v1/bgem3/info", timeout=60).json()
        texts = ["What is BGE M3?", "BM25 is a bag-of-words retrieval function"]
        answer = httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=120)
    from bgem3_embeddings.backends.keras_backend import backend_name

    this_machine = DeviceInventory(cpu_flags=read_cpu_flags(), backend=backend_name())
    expected, reason = resolve_serve_precision("auto", "cpu", this_machine)
    assert said == [f"bgem3 serve: --precision auto: {expected} ({reason})\n"], lines
    # `bgem3 doctor`, as a user runs it, names the same pick for serve, and the library's own for encode.
    doctor = subprocess.run(
        [sys.executable, "-m", "bgem3_embeddings.cli", "doctor"], capture_output=True, text=True, timeout=300
    )
    assert doctor.returncode == 0, doctor.stderr
    report = doctor.stdout.splitlines()
    assert f"  bgem3 serve: {expected} weights, {expected} matmuls ({reason})" in report, doctor.stdout
    library = BGEM3Encoder(tiny_checkpoint, device="cpu", show_progress=False).precision
    library_line = next(line for line in report if line.startswith("  library, bgem3 encode"))
    assert f": {library} weights" in library_line, library_line
    assert info["precision"] == expected
    assert answer.status_code == 200, answer.text
    got = np.array([item["embedding"] for item in answer.json()["data"]])
    want = ReferenceM3(tiny_checkpoint).encode(texts)["dense_vecs"]
    cosine = np.einsum("ij,ij->i", got, want) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.999, cosine
