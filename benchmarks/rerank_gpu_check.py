"""The reranker on one NVIDIA GPU: BGEM3Reranker on Keras' JAX and PyTorch backends against transformers'
XLMRobertaForSequenceClassification (the model FlagReranker runs), parity and speed, one table.

Made for the borrowed GPU machines (PyTorch, JAX, transformers, tokenizers, no TensorFlow; keras travels as
wheels, as for benchmarks/gpu_check.py: docs/performance.md has the carry list). It:

1. writes a full-size random-weight checkpoint in the bge-reranker-v2-m3 layout (tests/tiny_checkpoint.py);
2. builds the pairs of one query and N passages of T tokens with our pair building (the ids FlagReranker's own
   tokenization gives, tests/test_reranker.py) and scores them with transformers in length-sorted batches:
   float32 with eager attention and TF32 off (the reference), then bfloat16 and float16 with SDPA (timed;
   their error against the reference is what transformers itself loses in that dtype);
3. runs `BGEM3Reranker.score_token_ids` on the same ids on each Keras backend asked for, in a process where
   `import tensorflow` fails (tests/no_tensorflow.py), at float32, bfloat16 and float16: max |logit -
   reference| and tokens/s (the first call, where JAX compiles, untimed).

    python benchmarks/rerank_gpu_check.py --out DIR                   # the GPU machine: full size, CUDA
    python benchmarks/rerank_gpu_check.py --size tiny --device cpu    # the same steps on a tiny checkpoint

Pass: float32 within 1e-4 x max(1, max |reference|); bfloat16 / float16 within 2x transformers' own error in
that dtype plus one unit of it (2^-8, 2^-11) x max(1, max |reference|). Exit 1 when a row fails or an engine
does not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout: the package and tests/ come from there
    sys.path.insert(0, str(ROOT))

PRECISIONS = ("float32", "bfloat16", "float16")
HALF_UNIT = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
FP32_TOLERANCE = 1e-4
QUERY = "Which animal jumps over the lazy dog, and what do search engines return for a question?"


def pairs_token_ids(model: Path, passages: int, tokens: int) -> list[list[int]]:
    """The pairs' ids: rerank_bench's passages, FlagReranker's pair building (max_length 512)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rerank_bench import passages as make_passages

    from bgem3_embeddings.reranker.pairs import pair_token_ids
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    texts = make_passages(model, passages, tokens)
    return pair_token_ids(BGEM3Tokenizer.from_dir(model), [(QUERY, p) for p in texts], 512)


def _timed_calls(call: Any, min_seconds: float) -> tuple[float, int]:
    """Seconds per call (at least two calls, until min_seconds passed), after one untimed call."""
    call()
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < min_seconds:
        call()
        calls += 1
    return (time.perf_counter() - start) / calls, calls


def reference_rows(model: Path, ids: list[list[int]], device: str, min_seconds: float) -> list[dict]:
    """transformers' classifier on the ids, float32 eager (the reference) and bf16 / fp16 SDPA."""
    import torch
    from transformers import XLMRobertaForSequenceClassification

    from bgem3_embeddings.batching import length_sorted_batches, pad_batch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    batches = [
        (order, *pad_batch([ids[i] for i in order], 1))
        for order in length_sorted_batches([len(t) for t in ids], 128)
    ]
    rows = []
    for precision, attention in (("float32", "eager"), ("bfloat16", "sdpa"), ("float16", "sdpa")):
        dtype = getattr(torch, precision)
        net: Any = XLMRobertaForSequenceClassification.from_pretrained(
            str(model), dtype=dtype, attn_implementation=attention
        )
        net = net.to(device).eval()

        @torch.inference_mode()
        def run(net: Any = net) -> np.ndarray:
            scores = np.zeros(len(ids), np.float32)
            for order, batch_ids, mask in batches:
                out = net(
                    input_ids=torch.from_numpy(batch_ids).long().to(device),
                    attention_mask=torch.from_numpy(mask).long().to(device),
                ).logits[:, 0]
                scores[order] = out.float().cpu().numpy()
            return scores

        scores = run()
        seconds, calls = _timed_calls(run, min_seconds)
        rows.append({"engine": f"transformers-{attention}", "precision": precision, "scores": scores.tolist(),
                     "seconds": seconds, "calls": calls})  # fmt: skip
        del net
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def ours_worker(backend: str, model: str, ids_path: str, device: str, min_seconds: float) -> None:
    """One Keras backend in this process, TensorFlow hidden: score_token_ids at each precision."""
    os.environ["KERAS_BACKEND"] = backend
    from tests.no_tensorflow import hide_tensorflow

    hide_tensorflow()
    from bgem3_embeddings import BGEM3Reranker

    ids = json.loads(Path(ids_path).read_text())
    rows = []
    for precision in PRECISIONS:
        try:
            reranker = BGEM3Reranker(model, precision=precision, device=device, weights_cache=False)
            scores = reranker.score_token_ids(ids)
            seconds, calls = _timed_calls(lambda r=reranker: r.score_token_ids(ids), min_seconds)
            rows.append({"engine": f"ours-{backend}", "precision": precision, "scores": scores.tolist(),
                         "seconds": seconds, "calls": calls, "compute_dtype": reranker.compute_dtype,
                         "device": str(reranker.device)})  # fmt: skip
        except Exception as err:  # reported as the row's failure, the other precisions still run
            rows.append(
                {"engine": f"ours-{backend}", "precision": precision, "error": f"{type(err).__name__}: {err}"}
            )
    print("ROWS " + json.dumps(rows))


def judge(rows: list[dict], tokens: int) -> list[dict]:
    """Each row's error against the float32 reference, its tolerance, pass/fail and tokens/s."""
    ref = np.asarray(next(r for r in rows if r["engine"] == "transformers-eager")["scores"])
    scale = max(1.0, float(np.abs(ref).max()))
    own = {r["precision"]: float(np.abs(np.asarray(r["scores"]) - ref).max())
           for r in rows if r["engine"] == "transformers-sdpa"}  # fmt: skip
    for r in rows:
        if "error" in r:
            r["ok"] = False
            continue
        r["max_abs_diff"] = float(np.abs(np.asarray(r["scores"]) - ref).max())
        r["tokens_per_s"] = tokens / r["seconds"]
        if r["engine"].startswith("transformers"):
            r["ok"] = True
            continue
        p = r["precision"]
        r["tolerance"] = FP32_TOLERANCE * scale if p == "float32" else 2 * own[p] + HALF_UNIT[p] * scale
        r["ok"] = r["max_abs_diff"] <= r["tolerance"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/rerank-gpu-check")))
    parser.add_argument("--size", choices=["full", "tiny"], default="full")
    parser.add_argument("--model", type=Path, help="a reranker checkpoint already there")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backends", default="jax,torch")
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--passage-tokens", type=int, default=256)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        ours_worker(args.worker[0], str(args.model), args.worker[1], args.device, args.min_seconds)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from tests.tiny_checkpoint import make_tiny_reranker_checkpoint

        model = Path("/tmp") / f"rerank-gpu-{args.size}"
        if not (model / "model.safetensors").is_file():
            start = time.perf_counter()
            make_tiny_reranker_checkpoint(model, weights="safetensors", size=args.size, seed=0)
            print(f"checkpoint written in {time.perf_counter() - start:.0f} s", flush=True)
    ids = pairs_token_ids(model, args.passages, args.passage_tokens)
    tokens = sum(len(t) for t in ids)
    ids_path = args.out / "pair_ids.json"
    ids_path.write_text(json.dumps(ids))
    rows = reference_rows(model, ids, args.device, args.min_seconds)
    print("reference done", flush=True)
    for backend in [b for b in args.backends.split(",") if b]:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
        if backend == "jax":
            env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        command = [sys.executable, __file__, "--worker", backend, str(ids_path), "--model", str(model),
                   "--device", args.device, "--min-seconds", str(args.min_seconds)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        lines = [line for line in done.stdout.splitlines() if line.startswith("ROWS ")]
        if done.returncode != 0 or not lines:
            rows.append({"engine": f"ours-{backend}", "precision": "all", "error": done.stderr[-1500:]})
        else:
            rows += json.loads(lines[-1][5:])
        print(f"{backend} done", flush=True)
    rows = judge(rows, tokens)
    print(f"{len(ids)} pairs, {tokens} tokens (1 query x {args.passages} passages of {args.passage_tokens}), "
          f"device {args.device}, checkpoint {model}")  # fmt: skip
    print(f"{'engine':<20} {'precision':<9} {'max|diff|':>10} {'tolerance':>10} {'tok/s':>9}  ok")
    for r in rows:
        if "error" in r:
            print(f"{r['engine']:<20} {r['precision']:<9} failed: {r['error'][-300:]}")
            continue
        tolerance = f"{r['tolerance']:.2e}" if "tolerance" in r else "-"
        print(f"{r['engine']:<20} {r['precision']:<9} {r['max_abs_diff']:>10.2e} {tolerance:>10} "
              f"{r['tokens_per_s']:>9.0f}  {'yes' if r['ok'] else 'NO'}")  # fmt: skip
    (args.out / "rerank_gpu_check.json").write_text(json.dumps({"tokens": tokens, "rows": rows}, indent=1))
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
