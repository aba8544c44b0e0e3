"""benchmarks/gpu_profile.py and benchmarks/trace_summary.py: the GPU profile of docs/performance.md.

The summary on traces shaped as each profiler writes them on a GPU (PyTorch's "kernel" events; JAX's device
process and stream lines, with a derived line that must not count twice), the fusion bodies on a program
XLA really optimized, and the whole run as `make test` can: on the CPU, tiny checkpoint, both engines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.optional import require_module
from tests.support import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
trace_summary = load_benchmark("trace_summary")


def _x(name: str, ts: float, dur: float, pid: int = 1, tid: int = 7, **extra: object) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, **extra}


def _meta(what: str, name: str, pid: int, tid: int | None = None) -> dict:
    event = {"ph": "M", "name": what, "pid": pid, "args": {"name": name}}
    return event if tid is None else {**event, "tid": tid}


def test_torch_trace_counts_gpu_kernels_by_kind_and_the_device_idle_time() -> None:
    trace = [
        _x("aten::linear", 0, 900, pid=9, tid=1, cat="cpu_op"),  # host side: not counted where kernels exist
        _x("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x256x64", 0, 100, cat="kernel"),
        _x("fmha_cutlassF_f16_aligned_64x64_rf_sm80", 100, 50, cat="kernel"),
        _x("void at::native::vectorized_layer_norm_kernel<c10::Half, float>", 150, 20, cat="kernel"),
        _x("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", 170, 10, cat="kernel"),
        _x("Memcpy DtoH (Device -> Pinned)", 180, 5, cat="gpu_memcpy"),
    ]
    summary = trace_summary.summarize({"traceEvents": trace}, calls=1, wall_s=0.001)
    assert summary["source"] == "gpu"
    assert summary["kinds_us_per_call"] == {
        "gemm": 100, "attention": 50, "norm / reduce": 20, "gelu": 10, "copy / convert": 5
    }  # fmt: skip
    assert summary["busy_us_per_call"] == 185 and summary["idle_us_per_call"] == 1000 - 185
    assert summary["top_kernels"][0]["kind"] == "gemm"


def test_jax_trace_reads_the_device_streams_once_and_names_fusions_by_their_body() -> None:
    trace = [
        _meta("process_name", "/device:GPU:0 NVIDIA H200", pid=1),
        _meta("process_name", "/host:CPU", pid=2),
        _meta("thread_name", "Stream #7(Compute)", pid=1, tid=7),
        _meta("thread_name", "Stream #8(Compute)", pid=1, tid=8),
        _meta("thread_name", "XLA Ops", pid=1, tid=99),
        _x("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", 0, 300),
        _x(
            "loop_multiply_fusion_2",
            300,
            40,
            args={"hlo_op": "loop_multiply_fusion.2", "hlo_module": "jit_encoder_stack"},
        ),  # fmt: skip
        _x("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", 340, 60),
        _x("input_reduce_fusion", 380, 40, tid=8, args={"hlo_module": "jit_encoder_stack"}),  # overlaps
        _x("loop_multiply_fusion.2", 0, 400, tid=99),  # the derived "XLA Ops" line: the same work again
        _x("loop_multiply_fusion_2", 500, 10, args={"hlo_module": "jit_heads"}),  # same name, other module
        _x("PjitFunction(encoder_stack)", 0, 20, pid=2, tid=3),
    ]
    fusions = {"loop_multiply_fusion.2": "add erf multiply", "loop_multiply_fusion_2": "add erf multiply",
               "input_reduce_fusion": "add multiply reduce rsqrt"}  # fmt: skip
    summary = trace_summary.summarize({"traceEvents": trace}, 2, 0.002, fusions, "encoder_stack")
    assert summary["source"] == "gpu" and summary["events"] == 5
    kinds = summary["kinds_us_per_call"]
    assert kinds == {"gemm": 150, "attention": 30, "gelu": 20, "norm / reduce": 20, "other elementwise": 5}
    assert summary["busy_us_per_call"] == (420 + 10) / 2  # 380-420 overlaps the attention: counted once
    assert summary["modules_us_per_call"] == {"jit_encoder_stack": 40, "jit_heads": 5}
    assert summary["lanes"] == {"Stream #7(Compute)": 4, "Stream #8(Compute)": 1}
    table = trace_summary.side_by_side({"ours": summary, "theirs": summary}, "theirs")
    assert "gelu" in table and "1.00x" in table and "device idle" in table


def test_jax_trace_without_stream_names_still_skips_the_derived_lines() -> None:
    trace = [
        _meta("process_name", "/device:GPU:0", pid=1),
        _meta("thread_name", "GPU 0 compute", pid=1, tid=7),
        _meta("thread_name", "XLA Ops", pid=1, tid=99),
        _x("nvjet_tst_128x256", 0, 300),
        _x("nvjet_tst_128x256", 0, 300, tid=99),
    ]
    summary = trace_summary.summarize({"traceEvents": trace}, 1, 0.001)
    assert summary["kinds_us_per_call"] == {"gemm": 300} and summary["lanes"] == {"GPU 0 compute": 1}


def test_fusion_bodies_read_a_program_xla_optimized() -> None:
    jax = require_module("jax")
    from jax import lax

    def ffn(x: object, w: object) -> object:
        y = x @ w
        return 0.5 * y * (1.0 + lax.erf(y * 0.7071067811865476))

    x = jax.numpy.ones((8, 16))
    program = jax.jit(ffn).lower(x, jax.numpy.ones((16, 16))).compile().as_text()
    bodies = trace_summary.fusion_bodies(program)
    kinds = {trace_summary.body_kind(body) for body in bodies.values()}
    assert "gelu" in kinds, bodies
    assert all("parameter" not in body.split() for body in bodies.values())


def test_gpu_profile_runs_on_the_cpu_with_the_tiny_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The whole run as the GPU machine runs it (its own process per engine, TensorFlow hidden from ours):
    on the CPU the host's ops stand in for kernels."""
    require_module("jax")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--tiny", "--device", "cpu",
         "--model", str(tiny_checkpoint), "--shape", "2x16", "--calls", "2", "--warmup", "1",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_profile.json").read_text())
    ours, theirs = report["summaries"]["ours jax bfloat16"], report["summaries"]["transformers float32"]
    assert ours["source"] == theirs["source"] == "host"
    # XLA:CPU's thunks of the 24-layer program, named by what their fusions hold
    assert ours["kinds_us_per_call"]["gemm"] > 0 and ours["kinds_us_per_call"]["gelu"] > 0
    assert ours["modules_us_per_call"]["jit_encoder_stack"] > 0
    assert theirs["kinds_us_per_call"]["gemm"] > 0  # aten::linear
    assert report["program"]["fusion_kinds"]
    with tarfile.open(tmp_path / "gpu_profile_traces.tar") as bundle:
        sizes = {member.name: member.size for member in bundle.getmembers()}
    assert set(sizes) == {"ours_trace.json.gz", "transformers_trace.json.gz", "ours_stack_hlo.txt.gz"}
    assert min(sizes.values()) > 0
    # a GPU machine hands back at most 8 files per call: this run leaves 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu_profile.json", "gpu_profile.txt", "gpu_profile_traces.tar"
    ]  # fmt: skip
    assert (tmp_path / "gpu_profile.txt").read_text().strip() == done.stdout.strip()
