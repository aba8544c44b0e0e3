"""One training step's peak resident memory for one `bench --finetune` row at a chosen batch, in this process.

What docs/performance/finetune.md's "JAX: remat needs XLA's memory-optimised scheduler" table measured: the
row is built as `bgem3 bench --finetune` builds it (bench/finetune_step.py) on the batch it makes; with
`--steps N` (default 1) one warm-up step then N timed (`measure`, every figure printed), with `--steps 0` the
first step alone (for a batch whose step takes most of an hour). Set XLA_FLAGS yourself to compare
schedulers: training leaves a scheduler you chose alone.

    python benchmarks/findings/finetune_step_peak.py --model /tmp/full-bge-m3 --backend jax --remat \
        --batch 2x8x128 --sub-batch-size 8
    XLA_FLAGS=--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_DEFAULT \
        python benchmarks/findings/finetune_step_peak.py --model /tmp/full-bge-m3 --backend jax --remat \
        --batch 2x8x128 --sub-batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local checkpoint folder")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"), required=True)
    parser.add_argument("--batch", default="2x8x128", help="QUERIESxGROUPxPASSAGE_TOKENS")
    parser.add_argument("--remat", action="store_true", help="--gradient-checkpointing")
    parser.add_argument("--sub-batch-size", type=int, default=None, help="GradCache rows a pass")
    parser.add_argument("--lora-rank", type=int, default=None, help="LoRA instead of full fine-tuning")
    parser.add_argument("--steps", type=int, default=1, help="timed steps after a warm-up; 0: one step alone")
    args = parser.parse_args()
    os.environ["KERAS_BACKEND"] = args.backend  # before anything imports Keras
    from bgem3_embeddings.backends import prepare_training

    prepare_training()  # as bgem3 finetune does, before the first computation
    from bgem3_embeddings.bench.finetune_bench import FinetuneBenchOptions, fixed_batch, save_batch
    from bgem3_embeddings.bench.finetune_step import measure, ours_step, start_framework
    from bgem3_embeddings.bench.worker import hwm_mb
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    queries, group, length = (int(n) for n in args.batch.split("x"))
    options = FinetuneBenchOptions(
        model=args.model, batch_size=queries, group_size=group, passage_max_len=length
    )
    batch = fixed_batch(BGEM3Tokenizer.from_dir(args.model), options)
    with tempfile.TemporaryDirectory() as tmp:
        save_batch(Path(tmp) / "batch.npz", batch)
        spec = {"model": args.model, "batch": str(Path(tmp) / "batch.npz"), "steps": args.steps,
                "unified": True, "lora_rank": args.lora_rank, "device": "cpu",
                "sub_batch_size": args.sub_batch_size, "row": "finding", "engine": "ours",
                "backend": args.backend, "remat": args.remat}  # fmt: skip
        if args.steps > 0:
            result = measure(spec)
        else:
            start_framework(spec)
            step, info = ours_step(spec)
            result = {**info, "peak_rss_loaded_mb": hwm_mb()}
            started = time.perf_counter()
            result["loss"] = step()
            result.update({"first_step_s": time.perf_counter() - started, "peak_rss_mb": hwm_mb()})
    result["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    result["tokens_per_step"] = batch.tokens
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
