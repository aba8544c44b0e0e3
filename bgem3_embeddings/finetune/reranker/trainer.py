"""One `bgem3 finetune-reranker` run: load the cross-encoder, plan the steps, `fit()`, checkpoint, save.

The embedder's loop (finetune/trainer.py) with the reranker's pieces: the same training files and sampling
(data.py, with FlagEmbedding's reranker key "query_prompt" for a line's own instruction), the same seeded
plan, optimizer, schedule, checkpoints, Ctrl-C, --resume and LoRA; pairs (batches.py), loss (loss.py) and
the saved layout (save.py) are the reranker's.

    >>> result = run_reranker_finetune(RerankerFinetuneOptions(train_data=(Path("train.jsonl"),),
    ...                                model="tiny", output_dir=Path("tuned-reranker")))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bgem3_embeddings.backends import prepare_training
from bgem3_embeddings.checkpoint.files import CheckpointFiles, resolve_checkpoint
from bgem3_embeddings.finetune.batch_source import StepBatches
from bgem3_embeddings.finetune.data import read_training_data
from bgem3_embeddings.finetune.dropout import EncoderDropout, dropout_rates
from bgem3_embeddings.finetune.lora import enable_lora, write_adapter
from bgem3_embeddings.finetune.reranker.batches import pair_inputs, tokenize_pairs
from bgem3_embeddings.finetune.reranker.options import RerankerFinetuneOptions
from bgem3_embeddings.finetune.reranker.save import save_reranker_checkpoint
from bgem3_embeddings.finetune.reranker.train_model import RerankerFinetuner, classifier_dropout_rate
from bgem3_embeddings.finetune.schedule import LinearWarmupDecay
from bgem3_embeddings.finetune.state import STATE_DIR, restore_state, write_state
from bgem3_embeddings.finetune.trainer import (
    FinetuneResult,
    batch_maker,
    check_output,
    compile_for,
    fit_steps,
    make_plan,
)
from bgem3_embeddings.reranker.loading import build_reranker_model, reranker_config
from bgem3_embeddings.tokenizer import BGEM3Tokenizer

# The options a resumed run must share with the one it continues (the rest may change, e.g. --save-steps).
RESUME_FINGERPRINT = (
    "train_group_size",
    "query_max_len",
    "passage_max_len",
    "knowledge_distillation",
    "learning_rate",
    "num_train_epochs",
    "per_device_train_batch_size",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "seed",
    "optimizer",
    "max_steps",
    "lora_rank",
    "lora_alpha",
)
QUERY_PROMPT_KEY = "query_prompt"  # FlagEmbedding's reranker dataset reads a line's instruction here


def fingerprint(options: RerankerFinetuneOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in RESUME_FINGERPRINT}


def build_reranker_finetuner(
    files: CheckpointFiles, options: RerankerFinetuneOptions, total_steps: int
) -> tuple[RerankerFinetuner, LinearWarmupDecay]:
    """The reranker `options` describe (dropout from its config.json, LoRA or every weight trainable),
    compiled with its optimizer over `total_steps`, and the learning-rate schedule."""
    prepare_training()  # before JAX's first computation (backends/jax/training_flags.py)
    model = build_reranker_model(files, precision="float32", weights_cache=False)
    hidden, attention = dropout_rates(files.config)
    dropout = EncoderDropout(hidden, attention, seed=options.seed, remat=options.gradient_checkpointing)
    finetuner = RerankerFinetuner(
        model,
        group_size=options.train_group_size,
        knowledge_distillation=options.knowledge_distillation,
        dropout=dropout,
        classifier_dropout=classifier_dropout_rate(files.config),
    )
    if options.lora_rank is not None:
        # Adapters on the encoder's projections; the classification head trains whole.
        enable_lora(model, options.lora_rank, options.lora_alpha, options.seed)
        head = {id(v) for layer in (model.classifier_dense, model.classifier_out_proj) for v in layer.weights}
        for variable in model.weights:
            variable.trainable = id(variable) in head or "lora_kernel" in variable.path
    return finetuner, compile_for(finetuner, options, total_steps)


class RerankerRun:
    """What the checkpoint callback saves: the model in its layout plus the training state, atomically."""

    def __init__(
        self, options: RerankerFinetuneOptions, files: CheckpointFiles, finetuner: RerankerFinetuner
    ) -> None:
        self.options, self.files, self.finetuner = options, files, finetuner

    def save(self, step: int) -> None:
        sync = getattr(self.finetuner, "jax_state_sync", None)
        if callable(sync):
            sync()  # JAX keeps the training state outside the variables during fit()
        finetuner, options = self.finetuner, self.options

        def extra(folder: Path) -> None:
            state = folder / STATE_DIR
            write_state(state, finetuner, finetuner.optimizer, step=step, fingerprint=fingerprint(options))
            if options.save_adapter:
                write_adapter(finetuner.reranker, folder, options)

        save_reranker_checkpoint(
            finetuner.reranker,
            self.files.root,
            options.output_dir,
            overwrite=options.overwrite_output_dir or step > 0,
            extra=extra,
        )


def run_reranker_finetune(
    options: RerankerFinetuneOptions, *, verbose: int = 0, callbacks: Sequence[Any] = ()
) -> FinetuneResult:
    """Train the cross-encoder as `options` say; the tuned reranker ends in options.output_dir (it loads in
    BGEM3Reranker, `bgem3 rerank --model` and FlagEmbedding's FlagReranker). Raises ConfigError (not a
    reranker), TrainingDataError, TrainingStateError or CheckpointSaveError with a one-line message."""
    files = resolve_checkpoint(options.model, kind="reranker")
    reranker_config(files)  # an embedding model or a multi-label classifier is refused before anything
    data = read_training_data(
        options.train_data,
        knowledge_distillation=options.knowledge_distillation,
        skip_invalid=options.skip_invalid,
        train_group_size=options.train_group_size,
        prompt_key=QUERY_PROMPT_KEY,
    )
    state = check_output(options)  # before any weights load
    plan = make_plan(data, options)
    finetuner, schedule = build_reranker_finetuner(files, options, len(plan))
    run = RerankerRun(options, files, finetuner)
    start = 0
    if state is not None:
        restore_state(state, finetuner, finetuner.optimizer, fingerprint(options))
        start = state.step
    history: list[dict[str, float]] = []
    interrupted = False
    done = start
    if start < len(plan):
        tokenizer = BGEM3Tokenizer.from_dir(files.tokenizer_dir)
        make_batch = batch_maker(
            data,
            tokenizer,
            options,
            tokenize_pairs,
            query_instruction_for_retrieval=options.query_instruction_for_rerank,
            passage_instruction_for_retrieval=options.passage_instruction_for_rerank,
            passage_instruction_format=options.passage_instruction_format,
            shuffle_ratio=options.shuffle_ratio,
        )
        source = StepBatches(plan, make_batch, start_step=start, to_inputs=pair_inputs)
        done, interrupted = fit_steps(
            finetuner, source, run, options, schedule, history, verbose=verbose, callbacks=callbacks
        )
    run.save(done)
    return FinetuneResult(done, options.output_dir, interrupted, len(data.skipped), history)
