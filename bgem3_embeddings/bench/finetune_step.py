"""One row of `bgem3 bench --finetune` in a process of its own: build, one warm-up step, timed steps.

    python -m bgem3_embeddings.bench.finetune_step SPEC.json RESULT.json

A row is ours (`M3Finetuner` on the Keras backend the process starts with, the step `fit()` runs:
`train_on_batch`, i.e. forward, backward and the AdamW update of `bgem3 finetune`'s optimizer) or
FlagEmbedding's trainer model (`EncoderOnlyEmbedderM3Model` with torch's AdamW as Hugging Face's Trainer makes
it, gradients clipped at norm 1.0 as the Trainer does, gradient checkpointing on as its runner and the Trainer
turn it on). Every row trains on the same token ids (BATCH.npz, written once by finetune_bench.py), with the
dropout the checkpoint's config.json gives, full float32.

Peak RSS is the process's own (TensorFlow, JAX and PyTorch never share a process), so it counts the
framework, the model, the optimizer state and the step's activations; on a GPU (benchmarks/gpu_check.py) the
device's peak allocation is reported too.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.bench.worker import hwm_mb, reset_peak_rss, rss_mb

# Hugging Face's TrainingArguments / FlagEmbedding's defaults (both sides train with them).
LEARNING_RATE = 5e-5
TEMPERATURE = 0.02
MAX_GRAD_NORM = 1.0
SEED = 42
# What BATCH.npz holds: a TrainBatch's arrays (finetune/batches.py) and its real token count.
BATCH_ARRAYS = ("query_input_ids", "query_attention_mask", "passage_input_ids", "passage_attention_mask")

Step = Callable[[], float]  # one training step; returns the loss


# ------------------------------------------------------------------------------------------------ batch
def save_batch(path: Path, batch: Any) -> None:
    """A TrainBatch's arrays and token count into `path` (.npz), for every row to read."""
    np.savez(path, tokens=np.array(batch.tokens), **{name: getattr(batch, name) for name in BATCH_ARRAYS})


def load_batch(path: str | Path) -> Any:
    """The TrainBatch `save_batch` wrote."""
    from bgem3_embeddings.finetune.batches import TrainBatch

    with np.load(path) as data:
        arrays = {name: data[name] for name in BATCH_ARRAYS}
        tokens = int(data["tokens"])
    return TrainBatch(**arrays, teacher_scores=None, no_in_batch_neg=False, tokens=tokens)


# ------------------------------------------------------------------------------------------------ ours
def ours_step(spec: dict) -> tuple[Step, dict[str, Any]]:
    """Ours, built as `bgem3 finetune` builds it (trainer.run_finetune), and its training step."""
    import keras

    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.devices import DeviceInventory, choose_device
    from bgem3_embeddings.finetune.batch_source import model_inputs
    from bgem3_embeddings.finetune.options import FinetuneOptions
    from bgem3_embeddings.finetune.trainer import build_finetuner

    batch = load_batch(spec["batch"])
    options = FinetuneOptions(
        train_data=(), model=spec["model"], output_dir=Path(os.devnull),
        per_device_train_batch_size=batch.batch_size, train_group_size=batch.group_size,
        learning_rate=LEARNING_RATE, temperature=TEMPERATURE, max_grad_norm=MAX_GRAD_NORM, seed=SEED,
        unified_finetuning=spec["unified"], gradient_checkpointing=spec["remat"], lora_rank=spec["lora_rank"],
        sub_batch_size=spec.get("sub_batch_size"),
    )  # fmt: skip
    files = resolve_checkpoint(options.model)
    device = choose_device(spec.get("device", "cpu"), DeviceInventory.detect())
    with keras.device(device.keras_device):
        # the warm-up step is a step of the schedule too
        finetuner, _ = build_finetuner(files, options, total_steps=spec["steps"] + 1, device=device)
    inputs = model_inputs(batch, 0)

    def step() -> float:
        with keras.device(device.keras_device):
            logs = finetuner.train_on_batch(inputs, return_dict=True)  # fit()'s own train function
        return float(logs["loss"])

    info = {
        "trainable_params": int(sum(np.prod(v.shape) for v in finetuner.trainable_variables)),
        "keras_backend": keras.backend.backend(),
    }
    return step, info


# ------------------------------------------------------------------------------------------ FlagEmbedding
def hf_trainer_fused_adamw() -> bool:
    """Whether Hugging Face's Trainer would build torch's fused AdamW (its default `optim` is
    adamw_torch_fused with torch >= 2.8), read from the installed transformers."""
    from transformers import TrainingArguments

    return str(TrainingArguments.__dataclass_fields__["optim"].default).endswith("fused")


def flagembedding_step(spec: dict) -> tuple[Step, dict[str, Any]]:
    """FlagEmbedding's `EncoderOnlyEmbedderM3Model` with torch's AdamW, and one training step as Hugging
    Face's Trainer runs it (forward, backward, clip at MAX_GRAD_NORM, step, zero the gradients)."""
    import torch

    from bgem3_embeddings.bench.flagembedding_modules import m3_finetune_model

    torch.manual_seed(SEED)
    device = torch.device("cuda" if spec.get("device", "cpu") == "cuda" else "cpu")
    model = m3_finetune_model(
        spec["model"], temperature=TEMPERATURE, normalize_embeddings=True, unified_finetuning=spec["unified"],
        use_self_distill=False, kd_loss_type="kl_div",
    )  # fmt: skip
    if spec["remat"]:
        model.enable_input_require_grads()  # its runner, with --gradient_checkpointing
        model.gradient_checkpointing_enable()  # Hugging Face's Trainer, at train()
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    fused = hf_trainer_fused_adamw()
    optimizer = torch.optim.AdamW(
        params, lr=LEARNING_RATE, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=fused
    )
    batch = load_batch(spec["batch"])

    def side(ids: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        as_torch = {"input_ids": ids, "attention_mask": mask}
        return {k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in as_torch.items()}

    queries = side(batch.query_input_ids, batch.query_attention_mask)
    passages = side(batch.passage_input_ids, batch.passage_attention_mask)

    def step() -> float:
        loss = model(queries, passages, None, no_in_batch_neg_flag=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return float(loss.detach())

    info = {"trainable_params": int(sum(p.numel() for p in params)), "fused_adamw": fused}
    return step, info


# ------------------------------------------------------------------------------------------------ measuring
def start_framework(spec: dict) -> None:
    """Import and start the row's framework first: 'resident' then counts the model, not the runtime."""
    if spec["engine"] == "flagembedding":
        import torch
        import transformers  # noqa: F401

        torch.ones(4).sum()
    else:
        import keras

        import bgem3_embeddings.finetune.train_model  # noqa: F401 - the model code on this backend

        keras.ops.convert_to_numpy(keras.ops.sum(keras.ops.ones(4)))


def device_peak_mb(spec: dict) -> float | None:
    """The GPU's peak allocation (MB) on a CUDA run, as its framework counts it; None on the CPU."""
    if spec.get("device", "cpu") != "cuda":
        return None
    backend = "torch" if spec["engine"] == "flagembedding" else os.environ.get("KERAS_BACKEND", "")
    if backend == "torch":
        import torch

        return float(torch.cuda.max_memory_allocated()) / 2**20
    if backend == "jax":
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        return float(stats["peak_bytes_in_use"]) / 2**20 if "peak_bytes_in_use" in stats else None
    return None


def measure(spec: dict) -> dict[str, Any]:
    """Build the row, run one warm-up step (tracing, compilation, allocator growth), then time
    spec['steps'] steps; the figures as a dict."""
    start_framework(spec)
    result: dict[str, Any] = {"row": spec["row"], "rss_start_mb": rss_mb()}
    started = time.perf_counter()
    step, info = (flagembedding_step if spec["engine"] == "flagembedding" else ours_step)(spec)
    result.update(info)
    result["load_s"] = time.perf_counter() - started
    result["rss_loaded_mb"] = rss_mb()
    started = time.perf_counter()
    losses = [step()]
    result["first_step_s"] = time.perf_counter() - started
    # VmHWM, not ru_maxrss: Linux carries the parent's resident pages at fork into a child's ru_maxrss, a
    # fresh process's own memory map starts its high-water mark at exec.
    result["peak_rss_warmup_mb"] = hwm_mb()
    reset_peak_rss()  # from here on VmHWM counts the timed steps alone
    step_s = []
    for _ in range(spec["steps"]):
        started = time.perf_counter()
        losses.append(step())
        step_s.append(time.perf_counter() - started)
    tokens = load_batch(spec["batch"]).tokens
    result.update(
        {
            "tokens_per_step": tokens,
            "step_s": step_s,
            "tokens_per_s": tokens * len(step_s) / sum(step_s),
            "losses": losses,
            "peak_rss_steps_mb": hwm_mb(),
            "device_peak_mb": device_peak_mb(spec),
            "tensorflow_imported": "tensorflow" in sys.modules,
            "loadavg": os.getloadavg()[0],
        }
    )
    # The whole process at its peak (loading, warm-up, timed steps): what the machine must have.
    result["peak_rss_mb"] = max(result["peak_rss_warmup_mb"], result["peak_rss_steps_mb"])
    if not all(np.isfinite(losses)):
        raise FloatingPointError(f"{spec['row']}: a step's loss is not finite: {losses}")
    return result


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    if spec["engine"] != "flagembedding":
        os.environ["KERAS_BACKEND"] = spec["backend"]  # before anything imports Keras, which reads it once
        from bgem3_embeddings.backends import prepare_training

        prepare_training()  # as bgem3 finetune does, before start_framework's first computation
    Path(args[1]).write_text(json.dumps(measure(spec), indent=1))


if __name__ == "__main__":
    main()
