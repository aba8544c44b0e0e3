"""`bgem3 bench`: the run plan, the figures, and one small end-to-end run against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bgem3_embeddings.bench.peak import peak_dtypes
from bgem3_embeddings.bench.report import format_report
from bgem3_embeddings.bench.run import BenchOptions, plan, ratios, run_bench, split_precision
from bgem3_embeddings.devices import DeviceChoice, choose_compute_dtype, read_cpu_flags

CASCADE_LAKE = frozenset({"avx512f", "avx512_vnni"})
SAPPHIRE_RAPIDS = CASCADE_LAKE | {"avx512_bf16", "amx_bf16"}
PRECISIONS = ("float32", "bfloat16", "bfloat16:bfloat16")


def test_split_precision() -> None:
    assert split_precision("bfloat16") == ("bfloat16", "auto")
    assert split_precision("bfloat16:float32") == ("bfloat16", "float32")


def test_plan_runs_both_bf16_computes_where_bf16_is_emulated() -> None:
    options = BenchOptions(engines=("keras", "transformers", "keras-encode"), precisions=PRECISIONS)
    assert plan(options, CASCADE_LAKE) == [
        ("keras", "float32"),
        ("keras", "bfloat16"),  # bf16 weights, float32 matmuls on this CPU
        ("keras", "bfloat16:bfloat16"),  # bf16 matmuls (emulated)
        ("transformers", "float32"),
        ("transformers", "bfloat16"),  # autocast; a WEIGHTS:COMPUTE spec means nothing to transformers
        ("keras-encode", "float32"),
    ]


def test_plan_runs_a_keras_configuration_once() -> None:
    options = BenchOptions(engines=("keras",), precisions=PRECISIONS)
    # With native bf16, "bfloat16" already computes in bf16: "bfloat16:bfloat16" would repeat it.
    assert plan(options, SAPPHIRE_RAPIDS) == [("keras", "float32"), ("keras", "bfloat16")]


def test_plan_on_a_gpu_computes_in_the_weights_dtype() -> None:
    """--device metal: half-precision weights compute in their own dtype (no float32 widening to dedupe);
    int8 still runs, on the CPU."""
    from bgem3_embeddings.bench.worker import keras_device

    options = BenchOptions(engines=("keras",), precisions=("float32", "float16", "float16:float16", "int8"),
                           device="metal")
    assert plan(options, CASCADE_LAKE) == [("keras", "float32"), ("keras", "float16"), ("keras", "int8")]
    assert keras_device("metal", "int8") == "cpu" and keras_device("metal", "float16:float32") == "metal"


def test_peak_dtypes_follow_the_precisions() -> None:
    assert peak_dtypes(["float32", "int8"]) == ("float32",)
    assert peak_dtypes(["int8"]) == ("float32",)  # every report compares against the float32 peak
    assert peak_dtypes(["float32", "bfloat16:float32"]) == ("float32", "bfloat16")
    assert peak_dtypes(["float16:bfloat16"]) == ("float32", "bfloat16")


def test_ratios_divide_their_wall_and_cpu_time() -> None:
    rows = [
        {"engine": "keras", "precision": "float32", "wall_s": 2.0, "cpu_s": 4.0},
        {"engine": "transformers", "precision": "float32", "wall_s": 3.0, "cpu_s": 4.0},
        {"engine": "keras", "precision": "bfloat16", "error": "exit 1"},
    ]
    assert ratios(rows) == {
        "keras_fp32_vs_transformers_fp32": 1.5,
        "keras_fp32_vs_transformers_fp32_cpu_time": 1.0,
    }


def test_bench_runs_against_transformers_on_the_same_batches(tiny_checkpoint: Path) -> None:
    options = BenchOptions(
        model=str(tiny_checkpoint),
        engines=("keras", "transformers"),
        precisions=("float32", "bfloat16:float32"),
        texts=4,
        peak_tokens=64,  # a small GEMM: bf16 is emulated (slow) on AVX2-only CPUs
    )
    result = run_bench(options)
    rows = {(r["engine"], r["precision"]): r for r in result["engines"]}
    assert set(rows) == {
        ("keras", "float32"),
        ("keras", "bfloat16:float32"),
        ("transformers", "float32"),  # transformers runs plain precisions only
    }, [r.get("error") for r in result["engines"]]
    assert all("error" not in r for r in rows.values()), rows
    assert rows[("keras", "bfloat16:float32")]["compute_dtype"] == "float32"
    assert rows[("keras", "float32")]["compute_dtype"] == "float32"
    # Same token batches, same weights: the engines agree with ours in fp32.
    assert rows[("transformers", "float32")]["dense_cosine_vs_keras_fp32"] > 0.99999
    assert rows[("keras", "bfloat16:float32")]["dense_cosine_vs_keras_fp32"] > 0.999
    assert all(r["tokens_per_s"] > 0 and r["gflops_per_s"] > 0 for r in rows.values())
    assert result["corpus"]["texts"] == 4 and result["corpus"]["tokens"] > 0
    assert set(result["matmul_peak_best_gflops"]) == {"float32", "bfloat16"}
    assert result["ratios"]["keras_fp32_vs_transformers_fp32"] > 0
    startup = result["startup"]  # a fresh process: import, construction, first vector
    assert all(startup[k] > 0 for k in ("import_s", "construct_s", "first_vector_s")), startup
    report = format_report(result)
    assert "first vector" in report
    assert "transformers  float32" in report and "keras_fp32_vs_transformers_fp32" in report


@pytest.mark.parametrize("spec", ["bfloat16", "float16"])
def test_auto_compute_in_the_plan_follows_the_encoder(spec: str) -> None:
    """The plan's dedup uses the encoder's own rule, so the row labels match what runs."""
    flags = read_cpu_flags()
    expected = choose_compute_dtype(spec, DeviceChoice("cpu", "/CPU:0"), flags)
    options = BenchOptions(engines=("keras",), precisions=(spec, f"{spec}:{expected}"))
    assert plan(options, flags) == [("keras", spec)]


def test_plan_runs_onnxruntime_in_float32_and_int8() -> None:
    options = BenchOptions(
        engines=("keras", "transformers", "onnxruntime"), precisions=("float32", "bfloat16", "int8")
    )
    runs = plan(options, CASCADE_LAKE)
    assert [r for r in runs if r[0] == "onnxruntime"] == [("onnxruntime", "float32"), ("onnxruntime", "int8")]
    assert ("transformers", "int8") not in runs
    assert ("keras", "int8") in runs  # our precision="int8" beside ONNX Runtime's


def test_bench_runs_onnxruntime_exported_from_the_same_checkpoint(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    options = BenchOptions(
        model=str(tiny_checkpoint),
        engines=("keras", "onnxruntime"),
        precisions=("float32", "int8"),
        texts=4,
        peak_tokens=64,  # a small GEMM: bf16 is emulated (slow) on AVX2-only CPUs
        rounds=2,
        cache_dir=tmp_path,
        startup=False,
    )
    result = run_bench(options)
    rows = {(r["engine"], r["precision"]): r for r in result["engines"]}
    for key in (("keras", "float32"), ("keras", "int8"), ("onnxruntime", "float32"), ("onnxruntime", "int8")):
        assert key in rows and "error" not in rows[key], result["engines"]
    # The export is transformers' model + both heads: the same vectors as ours in fp32.
    assert rows[("onnxruntime", "float32")]["dense_cosine_vs_keras_fp32"] > 0.99999
    assert rows[("onnxruntime", "int8")]["dense_cosine_vs_keras_fp32"] > 0.9
    assert rows[("keras", "int8")]["dense_cosine_vs_keras_fp32"] > 0.99
    assert result["ratios"]["keras_int8_vs_onnxruntime_int8"] > 0
    # No bfloat16 precision asked for: no bfloat16 peak measured (a minute of torch on AVX2-only CPUs).
    assert set(result["matmul_peak_best_gflops"]) == {"float32"}
    assert len(rows[("onnxruntime", "float32")]["round_walls"]) == 2  # interleaved rounds, best kept
    assert result["ratios"]["keras_fp32_vs_onnxruntime_fp32"] > 0
    # int8 is converted once before the timed runs, so no timed process pays (or holds) the conversion.
    assert "error" not in result["int8_convert"] and result["int8_convert"]["seconds"] > 0
    report = format_report(result)
    assert "keras_fp32_vs_onnxruntime_fp32" in report and "int8 conversion" in report
