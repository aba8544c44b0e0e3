"""`bgem3 bench`: the run plan, the figures, and one small end-to-end run against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest

from bgem3_embeddings.bench.peak import peak_dtypes
from bgem3_embeddings.bench.report import format_report
from bgem3_embeddings.bench.run import (
    BenchOptions,
    keep_best_round,
    plan,
    ratios,
    run_bench,
    split_precision,
)
from bgem3_embeddings.devices import DeviceChoice, choose_compute_dtype, read_cpu_flags
from tests.optional import require_module

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


def test_bench_runs_every_kind_of_engine_on_the_same_batches(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """One small end-to-end run, each engine in its own process as the bench runs them (one run: each
    process imports its framework and loads the model, so a second run would repeat ours on TensorFlow):
    - ours in fp32 and int8 beside transformers and ONNX Runtime (exported from the same checkpoint), the
      same token batches, then the start-up timing in a fresh process;
    - ours on JAX and KerasHub's CLS + L2 on PyTorch give the vectors ours gives on TensorFlow, and the
      report puts tokens/s per Keras backend side by side (keras-torch and kerashub-jax are the same code
      with the other backend's name).
    (A "weights:compute" precision such as bfloat16:float32 is the same worker with other arguments: the
    plan tests above cover how it is split and run.)"""
    require_module("onnxruntime")
    require_module("onnx")
    require_module("jax")
    require_module("keras_hub")
    options = BenchOptions(
        model=str(tiny_checkpoint),
        engines=("keras", "transformers", "onnxruntime", "keras-jax", "kerashub-torch"),
        precisions=("float32", "int8"),
        texts=4,
        peak_tokens=64,
        dense_only=True,
        cache_dir=tmp_path,
    )
    result = run_bench(options)
    rows = {(r["engine"], r["precision"]): r for r in result["engines"]}
    assert set(rows) == {
        ("keras", "float32"),
        ("keras", "int8"),  # our precision="int8" beside ONNX Runtime's
        ("transformers", "float32"),  # transformers runs plain precisions only
        ("onnxruntime", "float32"),
        ("onnxruntime", "int8"),
        ("keras-jax", "float32"),  # int8 is TensorFlow's alone
        ("kerashub-torch", "float32"),
    }, [r.get("error") for r in result["engines"]]
    assert all("error" not in r for r in rows.values()), rows
    assert rows[("keras", "float32")]["compute_dtype"] == "float32"
    # Same token batches, same weights: the engines agree with ours in fp32. The ONNX export is
    # transformers' model + both heads.
    for engine in ("transformers", "onnxruntime", "keras-jax", "kerashub-torch"):
        assert rows[(engine, "float32")]["dense_cosine_vs_keras_fp32"] > 0.99999, engine
    assert rows[("onnxruntime", "int8")]["dense_cosine_vs_keras_fp32"] > 0.9
    assert rows[("keras", "int8")]["dense_cosine_vs_keras_fp32"] > 0.99
    for engine in ("keras-jax", "kerashub-torch"):
        assert rows[(engine, "float32")]["keras_backend"] == engine.rpartition("-")[2]
    assert all(r["tokens_per_s"] > 0 and r["gflops_per_s"] > 0 for r in rows.values())
    assert all(len(r["round_walls"]) == 1 for r in rows.values())
    assert result["corpus"]["texts"] == 4 and result["corpus"]["tokens"] > 0
    assert set(result["matmul_peak_best_gflops"]) == {"float32"}
    for ratio in ("keras_fp32_vs_transformers_fp32", "keras_fp32_vs_onnxruntime_fp32",
                  "keras_int8_vs_onnxruntime_int8"):  # fmt: skip
        assert result["ratios"][ratio] > 0, ratio
    by_backend = {e["backend"]: e for e in result["keras_backends"]}
    assert by_backend["jax"]["ours_tokens_per_s"] > 0 and by_backend["jax"]["kerashub_tokens_per_s"] is None
    assert by_backend["torch"]["kerashub_tokens_per_s"] > 0 and by_backend["torch"]["ratio"] is None
    # int8 is converted once before the timed runs, so no timed process pays (or holds) the conversion.
    assert "error" not in result["int8_convert"] and result["int8_convert"]["seconds"] > 0
    startup = result["startup"]  # a fresh process: import, construction, first vector
    assert all(startup[k] > 0 for k in ("import_s", "construct_s", "first_vector_s")), startup
    report = format_report(result)
    assert "first vector" in report and "int8 conversion" in report
    assert "transformers    float32" in report and "keras_fp32_vs_transformers_fp32" in report
    assert "keras_fp32_vs_onnxruntime_fp32" in report
    assert "ours vs KerasHub, same backend" in report and "ours computes the dense vectors only" in report
    assert "kerashub-torch  float32" in report


def test_rounds_keep_each_runs_best_wall_time_and_list_them_all() -> None:
    """`--rounds N` runs the engine list N times, interleaved; each engine keeps its fastest run without an
    error, with every round's wall time."""
    best: dict[tuple[str, str], dict] = {}
    key = ("onnxruntime", "int8")
    keep_best_round(best, key, {"error": "killed", "wall_s": None})
    keep_best_round(best, key, {"wall_s": 3.0})
    keep_best_round(best, key, {"wall_s": 4.0})
    assert best[key] == {"wall_s": 3.0, "round_walls": [None, 3.0, 4.0]}


# ------------------------------------------------------------ Keras backends beside KerasHub (issue 42, 8)
def test_plan_runs_float_precisions_only_beside_tensorflow() -> None:
    """int8 (TFLite) is ours on TensorFlow alone; KerasHub runs plain dtypes (no WEIGHTS:COMPUTE)."""
    require_module("jax")
    require_module("keras_hub")
    options = BenchOptions(
        engines=("keras", "keras-jax", "kerashub-torch"), precisions=("float32", "bfloat16:float32", "int8")
    )
    assert plan(options, CASCADE_LAKE) == [
        ("keras", "float32"),
        ("keras", "bfloat16:float32"),
        ("keras", "int8"),
        ("keras-jax", "float32"),
        ("keras-jax", "bfloat16:float32"),
        ("kerashub-torch", "float32"),
    ]


def test_engine_backend_names_the_keras_backend_of_each_engine() -> None:
    from bgem3_embeddings.bench.worker import engine_backend

    backends = ["tensorflow", "jax", "torch"]
    assert [engine_backend(e) for e in ("keras", "keras-jax", "keras-torch")] == backends
    assert [engine_backend(e) for e in ("kerashub", "kerashub-jax", "kerashub-torch")] == backends
    assert engine_backend("transformers") is None and engine_backend("keras-startup") == "tensorflow"


def test_hf_cache_holds_the_checkpoint_as_the_hub_id(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from huggingface_hub import try_to_load_from_cache

    from bgem3_embeddings.bench.kerashub import hf_cache_for

    root = hf_cache_for(tiny_checkpoint, tmp_path / "hf")
    assert hf_cache_for(tiny_checkpoint, tmp_path / "hf") == root  # a second call finds it in place
    # huggingface_hub's own cache lookup resolves the hub id to our files (what KerasHub's hf:// reads).
    found = try_to_load_from_cache("BAAI/bge-m3", "model.safetensors", cache_dir=root)
    assert isinstance(found, str)
    assert Path(found).resolve() == (tiny_checkpoint / "model.safetensors").resolve()
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="lacks model.safetensors"):
        hf_cache_for(tmp_path / "bare", tmp_path / "hf2")


def test_backend_comparison_pairs_ours_with_kerashub_per_backend() -> None:
    from bgem3_embeddings.bench.run import backend_comparison

    def row(engine: str, wall: float, cpu: float) -> dict:
        return {"engine": engine, "precision": "float32", "wall_s": wall, "cpu_s": cpu,
                "tokens_per_s": 100 / wall, "tokens_per_cpu_s": 100 / cpu}  # fmt: skip

    rows = [
        row("keras-jax", 2.0, 3.0),
        row("kerashub-jax", 3.0, 3.0),
        {"engine": "keras-torch", "precision": "float32", "error": "exit 1"},
        row("kerashub-torch", 4.0, 4.0),
    ]
    jax, torch = backend_comparison(rows)  # no TensorFlow row: that backend is left out
    assert jax["backend"] == "jax" and jax["ratio"] == 1.5 and jax["ratio_cpu_time"] == 1.0
    assert torch["backend"] == "torch" and torch["ours_tokens_per_s"] is None and torch["ratio"] is None
    assert torch["kerashub_tokens_per_s"] == 25.0


def test_bench_names_the_install_for_a_missing_keras_engine_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked by finding, not importing, the package: an import of JAX or KerasHub in the command's own
    process would start a backend beside the workers."""
    import importlib.util

    from bgem3_embeddings.bench.cli import _require_keras_engines
    from bgem3_embeddings.cli_support import CommandError

    real = importlib.util.find_spec
    hidden = "keras_hub"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == hidden else real(name))
    expected = r"--engine kerashub-torch needs keras_hub.*--no-deps keras-hub==0.32"
    with pytest.raises(CommandError, match=expected):
        _require_keras_engines({"keras", "kerashub-torch"})
    _require_keras_engines({"keras", "keras-torch"})  # no KerasHub engine asked for: nothing to say


def test_a_row_above_the_matmul_peak_says_why() -> None:
    from bgem3_embeddings.bench.report import engine_notes

    row = {"engine": "keras-jax", "keras_backend": "jax", "tensorflow_imported": False}
    assert engine_notes({**row, "peak_fraction": 0.6}) == []
    (note,) = engine_notes({**row, "peak_fraction": 1.8})
    assert note.startswith("keras-jax ran above the matmul peak") and "splits a batch" in note
    (imported,) = engine_notes({**row, "tensorflow_imported": True, "peak_fraction": None})
    assert "imported TensorFlow" in imported
