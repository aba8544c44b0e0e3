"""benchmarks/gpu_check.py, the GPU check of docs/performance.md, run as `make test` can: on the CPU with the
tiny checkpoint (the same engines, processes and table as on a GPU), plus its verdicts on made-up outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.optional import require_module
from tests.support import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
gpu_check = load_benchmark("gpu_check")


def _outputs(rng: np.random.Generator, error: float = 0.0) -> dict[str, np.ndarray]:
    """Outputs shaped as the check's parity batch gives them (2 rows, 4 tokens), plus `error` everywhere."""
    base = {
        "dense_vecs": np.full((2, 8), 0.25),
        "sparse_weights": np.array([[0.0, 3.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0]]),
        "colbert_vecs": rng.normal(size=(2, 3, 8)) / 3,
    }
    return {k: v + error for k, v in base.items()}


def test_output_errors_compare_real_colbert_rows_and_scale_sparse_weights() -> None:
    rng = np.random.default_rng(0)
    ref = _outputs(rng)
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    got = {k: v.copy() for k, v in ref.items()}
    got["colbert_vecs"][1, 2] += 5.0  # the padding row of the second text: not compared
    got["sparse_weights"][0, 1] += 0.3  # the largest weight is 3: 0.1 after scaling
    errors = gpu_check.output_errors(got, ref, mask)
    assert errors == pytest.approx({"dense_vecs": 0.0, "sparse_weights": 0.1, "colbert_vecs": 0.0})
    got["colbert_vecs"][1, 1] += 0.01  # a real token's vector: compared
    assert gpu_check.output_errors(got, ref, mask)["colbert_vecs"] == pytest.approx(0.01)
    zero = {**ref, "sparse_weights": np.zeros_like(ref["sparse_weights"])}  # nothing to compare with
    assert gpu_check.output_errors(zero, zero, mask)["sparse_weights"] is None


def test_tolerance_is_1e5_at_float32_and_follows_transformers_in_half_precision() -> None:
    assert gpu_check.tolerance("float32", None) == 1e-5
    assert gpu_check.tolerance("bfloat16", 0.01) == pytest.approx(2 * 0.01 + 2**-8)
    assert gpu_check.tolerance("float16", 1e-3) == pytest.approx(2 * 1e-3 + 2**-11)
    assert gpu_check.tolerance("float16", None) is None  # no transformers figure: no verdict


def test_rows_flag_a_wrong_output_and_divide_by_transformers_fp16_sdpa(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    mask = np.ones((2, 4), np.int32)
    ref = _outputs(rng)
    np.savez(tmp_path / "transformers-float32.npz", **ref)
    np.savez(tmp_path / "transformers-bfloat16.npz", **{k: v + 0.01 for k, v in ref.items()})
    np.savez(tmp_path / "ours-jax-float32.npz", **{k: v + 1e-3 for k, v in ref.items()})  # a wrong path
    np.savez(tmp_path / "ours-jax-bfloat16.npz", **{k: v + 0.02 for k, v in ref.items()})  # within 2x + 2^-8
    timing = {"4x8": {"tokens_per_s": 100.0, "first_call_s": 1.0, "calls": 3}}
    fast = {"4x8": {"tokens_per_s": 250.0, "first_call_s": 9.0, "calls": 3}}
    results = {
        "transformers": {"sdpa_timings": {"float16": timing, "bfloat16": {"error": "not run: out of time"}}},
        "ours-jax": {"runs": {p: {"timings": fast, "compute_dtype": p} for p in ("float32", "bfloat16")}},
        "ours-torch": {"error": "ours-torch exit 1: ImportError"},
    }
    rows = gpu_check.build_rows(results, tmp_path, mask, ["4x8"], ["float32", "bfloat16"])
    by = {(r["engine"], r["backend"], r["precision"]): r for r in rows}
    assert by[("ours", "jax", "float32")]["ok"] is False
    assert by[("ours", "jax", "bfloat16")]["ok"] is True
    assert ("ours", "jax", "float16") not in by  # not asked for
    assert by[("ours", "torch", "float32")]["error"].startswith("ours-torch exit 1")
    assert by[("ours", "jax", "bfloat16")]["vs_baseline"] == {"4x8": 2.5}
    assert by[("transformers-sdpa", "torch", "bfloat16")]["error"] == "not run: out of time"
    table = gpu_check.format_table(rows, ["4x8"], "header")
    assert "FAIL" in table and "2.50x" in table and "failed: ours-torch exit 1" in table
    assert "target: ours on JAX bf16 >= 1.0x transformers fp16 SDPA at 4x8: 2.50x" in table


def test_gpu_check_runs_on_the_cpu_with_the_tiny_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The whole check as the GPU machine runs it (its own process per engine, TensorFlow hidden from ours),
    on the CPU: ours on JAX and PyTorch within tolerance of transformers in float32 and bfloat16."""
    require_module("jax")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--device", "cpu",
         "--model", str(tiny_checkpoint), "--precisions", "float32,bfloat16", "--shapes", "4x32",
         "--min-seconds", "0.05",
         "--budget-s", "400", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = {(r["engine"], r["backend"], r["precision"]): r for r in report["rows"]}
    for backend in ("jax", "torch"):
        assert not report["engines"][f"ours-{backend}"]["tensorflow_imported"]
        for precision in ("float32", "bfloat16"):
            row = rows[("ours", backend, precision)]
            assert row["ok"] is True, row
            assert set(row["timings"]) == {"4x32"}  # one shape: each costs JAX a compilation
            assert all(t["tokens_per_s"] > 0 and t["calls"] >= 3 for t in row["timings"].values())
    assert rows[("ours", "jax", "float32")]["tolerance"] == 1e-5
    assert max(rows[("transformers", "torch", "bfloat16")]["errors"].values()) > 1e-4  # a real half dtype
    assert rows[("transformers-sdpa", "torch", "float16")]["timings"]["4x32"]["tokens_per_s"] > 0
    table = (tmp_path / "gpu_check.txt").read_text()
    assert table.strip() == done.stdout.strip()
    assert "target: ours on JAX bf16 >= 1.0x transformers fp16 SDPA at 4x32" in table
    # The training step (--tiny: 2 queries x group 2 x 16 tokens): ours on both backends beside FlagEmbedding.
    assert "training step: 2 queries x group 2 x 16 tokens" in table
    train = {(r["engine"], r["backend"]): r for r in report["train_rows"]}
    theirs = train[("flagembedding", "torch")]
    if gpu_check.flagembedding_missing() is None:
        assert theirs["tokens_per_s"] > 0 and theirs["tokens_per_step"] == 2 * 16 + 2 * 2 * 16
    else:
        assert theirs["skipped"].startswith("not run: ") and theirs["skipped"] in table
    for backend in ("jax", "torch"):
        row = train[("ours", backend)]
        assert row["keras_backend"] == backend and not row["tensorflow_imported"]
        assert row["tokens_per_s"] > 0 and len(row["step_s"]) == 1
        if "tokens_per_s" in theirs:
            assert row["vs_flagembedding"] == pytest.approx(row["tokens_per_s"] / theirs["tokens_per_s"])


def test_the_training_table_says_why_a_row_did_not_run() -> None:
    ours = {"engine": "ours", "backend": "jax", "tokens_per_s": 1234.0, "step_s": [2.0], "first_step_s": 30.0,
            "device_peak_mb": 4096.0, "peak_rss_mb": 3000.0, "vs_flagembedding": None}  # fmt: skip
    skipped = {"engine": "flagembedding", "backend": "torch", "skipped": "not run: datasets not installed"}
    failed = {"engine": "ours", "backend": "torch", "error": "train-ours-torch exit 1: OOM"}
    table = gpu_check.format_training([ours, failed, skipped], "training step: header")
    assert "1,234" in table and "4,096" in table and "30.0" in table
    assert "failed: train-ours-torch exit 1: OOM" in table
    assert "not run: datasets not installed" in table
    assert gpu_check.parse_train_shape("4x8x512") == (4, 8, 512)
    for bad in ("4x8", "0x8x512", "4x8x2", "axbxc"):
        with pytest.raises(Exception, match="QUERIESxGROUPxTOKENS"):
            gpu_check.parse_train_shape(bad)


def test_without_a_gpu_it_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    if gpu_check.no_gpu_line("cuda") is None:
        pytest.skip("this machine has an NVIDIA GPU: the check would run")
    assert gpu_check.main(["--device", "cuda"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("gpu_check: no GPU on this machine") and "nothing timed" in out
