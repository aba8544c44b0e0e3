"""benchmarks/jax_attention_variants.py: the JAX rows of docs/performance.md, and the GEMM count that shows
what each row's program really runs.

The count matters because XLA drops dead code: a `no-attention` row whose context was v alone left q and k
unused, and the program ran two GEMMs per layer fewer than the model (read as "attention costs X" when
it measured attention and two projections). The run itself is the GPU machine's, on the CPU and the tiny
checkpoint, as `make test` can.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.optional import require_module
from tests.support import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
trace_summary = load_benchmark("trace_summary")

# Lines as XLA:GPU writes an optimized program: two cuBLAS GEMMs (plain and Lt), a Triton GEMM fusion whose
# computation holds the dot, and cuDNN's fused attention, which is not a GEMM of ours.
GPU_PROGRAM = """\
%triton_gemm_computation (p0: bf16[64,32], p1: bf16[32,16]) -> bf16[64,16] {
  %p0 = bf16[64,32]{1,0} parameter(0)
  %p1 = bf16[32,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[64,32], b: bf16[32,16], c: bf16[32,32]) -> bf16[64,16] {
  %a = bf16[64,32]{1,0} parameter(0)
  %b = bf16[32,16]{1,0} parameter(1)
  %c = bf16[32,32]{1,0} parameter(2)
  %gemm.1 = (bf16[64,32]{1,0}, s8[0]{0}) custom-call(%a, %c), custom_call_target="__cublas$gemm"
  %gemm.2 = (bf16[64,32]{1,0}, s8[0]{0}) custom-call(%a, %c), custom_call_target="__cublas$lt$matmul"
  %fmha = (bf16[1,64,2,16]{3,2,1,0}, u8[0]{0}) custom-call(%a), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %fusion.3 = bf16[64,16]{1,0} fusion(%a, %b), kind=kCustom, calls=%triton_gemm_computation
}
"""


def test_matmul_count_reads_cublas_triton_and_not_cudnn_attention() -> None:
    assert trace_summary.matmul_count(GPU_PROGRAM) == 3


def test_matmul_count_of_a_program_xla_optimized_drops_dead_code() -> None:
    jax = require_module("jax")
    x, w = jax.numpy.ones((8, 16)), jax.numpy.ones((16, 16))

    def compiled(f: object) -> str:
        return jax.jit(f).lower(x, w).compile().as_text()

    assert trace_summary.matmul_count(compiled(lambda x, w: (x @ w) @ w.T)) == 2
    # the second product is unused: XLA removes it, as it removed the no-attention row's q and k
    assert trace_summary.matmul_count(compiled(lambda x, w: [x @ w, x @ w.T][0])) == 1


def test_variants_run_on_the_cpu_and_keep_the_model_s_gemms(tiny_checkpoint: Path, tmp_path: Path) -> None:
    require_module("jax")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "jax_attention_variants.py"), "--tiny", "--device", "cpu",
         "--model", str(tiny_checkpoint), "--variants", "package,no-attention,erfc-gelu", "--shapes", "2x16",
         "--min-seconds", "0.05", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "jax_attention_variants.json").read_text())
    rows = {row["variant"]: row for row in report["rows"]}
    layers = json.loads((tiny_checkpoint / "config.json").read_text())["num_hidden_layers"]
    # On the CPU the package attends in XLA: q, k, v, out, FFN in, FFN out, scores, context per layer.
    assert rows["package"]["matmuls"] == 8 * layers
    assert rows["package"]["ok"] is True and rows["erfc-gelu"]["ok"] is True
    # No scores and no context, but every projection: q and k stay in the program.
    assert rows["no-attention"]["matmuls"] == 6 * layers
    assert "errors" not in rows["no-attention"]
    assert all(row["timings"]["2x16"]["tokens_per_s"] > 0 for row in rows.values())
    table = (tmp_path / "jax_attention_variants.txt").read_text()
    assert table.strip() in done.stdout
    assert table.splitlines()[1].split()[:6] == ["attention", "dense", "sparse", "colbert", "ok", "GEMMs"]
