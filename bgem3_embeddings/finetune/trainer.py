"""One `bgem3 finetune` run: load, choose what trains, plan the steps, `fit()`, checkpoint, save.

The data flow: training files (data.py) -> a plan of steps (each a batch of example indices, seeded) ->
sampled, tokenized batches (batches.py, batch_source.py) -> `M3Finetuner.fit()` (train_model.py, loss.py)
-> the output folder in BAAI's layout with the training state beside it (save.py, state.py), written every
`save_steps` steps, on Ctrl-C and at the end.

    >>> result = run_finetune(FinetuneOptions(train_data=(Path("train.jsonl"),), model="tiny",
    ...                                       output_dir=Path("tuned")))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import keras

from bgem3_embeddings.backends import prepare_training
from bgem3_embeddings.checkpoint.files import CheckpointFiles, resolve_checkpoint
from bgem3_embeddings.devices import CPU, DeviceChoice
from bgem3_embeddings.finetune import data_parallel
from bgem3_embeddings.finetune.batch_source import StepBatches, fit_input, model_inputs
from bgem3_embeddings.finetune.batches import tokenize_batch
from bgem3_embeddings.finetune.callbacks import CheckpointEvery, JsonLog, SparseCollapseWarning, StopOnSignal
from bgem3_embeddings.finetune.data import (
    TrainingData,
    epoch_batches,
    read_training_data,
    sample_group,
    sampling_rng,
)
from bgem3_embeddings.finetune.dropout import EncoderDropout, dropout_rates
from bgem3_embeddings.finetune.lora import enable_lora, write_adapter
from bgem3_embeddings.finetune.loss import LossSettings
from bgem3_embeddings.finetune.optimizer import adamw
from bgem3_embeddings.finetune.options import FinetuneOptions, LoopOptions
from bgem3_embeddings.finetune.save import check_output_dir, save_bgem3_checkpoint
from bgem3_embeddings.finetune.schedule import LinearWarmupDecay
from bgem3_embeddings.finetune.state import (
    STATE_DIR,
    TrainingState,
    TrainingStateError,
    read_state,
    restore_state,
    write_state,
)
from bgem3_embeddings.finetune.train_model import MIXED, M3Finetuner
from bgem3_embeddings.loading import build_model, check_heads
from bgem3_embeddings.tokenizer import BGEM3Tokenizer

logger = logging.getLogger(__name__)

# The options a resumed run must share with the one it continues (the rest may change, e.g. --save-steps).
RESUME_FINGERPRINT = (
    "train_group_size",
    "query_max_len",
    "passage_max_len",
    "knowledge_distillation",
    "temperature",
    "learning_rate",
    "num_train_epochs",
    "per_device_train_batch_size",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "unified_finetuning",
    "use_self_distill",
    "self_distill_start_step",
    "kd_loss_type",
    "fix_encoder",
    "seed",
    "optimizer",
    "max_steps",
    "lora_rank",
    "lora_alpha",
    "precision",
    "data_parallel",
    "negatives_cross_device",
)


@dataclass
class FinetuneResult:
    steps: int  # steps completed, in all runs
    output_dir: Path
    interrupted: bool
    skipped_lines: int
    history: list[dict[str, float]] = field(default_factory=list)
    devices: int = 1  # the devices each step was split between (--data-parallel)


# Every step of the run: (epoch, example indices), in order.
Plan = tuple[tuple[int, tuple[int, ...]], ...]
Batch = TypeVar("Batch")  # a step's tokenized batch: batches.TrainBatch, the reranker's PairBatch


def make_plan(data: TrainingData, options: LoopOptions, devices: int = 1) -> Plan:
    """num_train_epochs of seeded batches (a fractional last epoch is cut, as Hugging Face's Trainer does),
    then cut at --max-steps. On `devices` devices a batch holds per_device_train_batch_size queries for each,
    and a short last batch is cut to a multiple of `devices` (each device gets as many; one shorter than
    `devices` is left out)."""
    size = options.per_device_train_batch_size * devices

    def batches(epoch: int) -> list[tuple[int, ...]]:
        cut = (b[: len(b) - len(b) % devices] for b in epoch_batches(data, size, options.seed, epoch))
        return [tuple(b) for b in cut if b]

    total = math.ceil(len(batches(0)) * options.num_train_epochs)
    if options.max_steps is not None:
        total = options.max_steps
    steps: list[tuple[int, tuple[int, ...]]] = []
    epoch = 0
    while len(steps) < total:
        steps += [(epoch, b) for b in batches(epoch)]
        epoch += 1
    return tuple(steps[:total])


def batch_maker(
    data: TrainingData,
    tokenizer: BGEM3Tokenizer,
    options: LoopOptions,
    tokenize: Callable[..., Batch],
    **instructions: Any,
) -> Callable[[int, tuple[int, tuple[int, ...]]], Batch]:
    """make_batch(step, (epoch, indices)): each example sampled by its own seeded stream (resumable), with
    the command's `instructions` (sample_group's keywords), then cut and padded by `tokenize`
    (batches.tokenize_batch, or the reranker's tokenize_pairs)."""

    def make(step: int, entry: tuple[int, tuple[int, ...]]) -> Batch:
        epoch, indices = entry
        groups = [
            sample_group(
                data.examples[i],
                options.train_group_size,
                sampling_rng(options.seed, epoch, i),
                knowledge_distillation=options.knowledge_distillation,
                query_instruction_format=options.query_instruction_format,
                **instructions,
            )
            for i in indices
        ]
        return tokenize(
            tokenizer, groups, query_max_len=options.query_max_len, passage_max_len=options.passage_max_len
        )

    return make


def choose_trainable(finetuner: M3Finetuner, options: FinetuneOptions) -> None:
    """What trains: everything (FlagEmbedding's default), the heads only (--fix-encoder), or LoRA adapters
    plus the heads (--lora-rank; with --lora-heads the heads' own adapters instead of their weights). The
    heads train only where the loss reaches them (--unified-finetuning)."""
    encoder = finetuner.encoder
    # the heads' kernels and biases (taken before LoRA adds its factors to the layers)
    heads = {id(v) for layer in (encoder.sparse_linear, encoder.colbert_linear) for v in layer.weights}
    if options.lora_rank is not None:
        enable_lora(encoder, options.lora_rank, options.lora_alpha, options.seed, heads=options.lora_heads)
    for variable in encoder.weights:
        if id(variable) in heads:
            variable.trainable = options.unified_finetuning and not options.lora_heads
        elif options.fix_encoder:
            variable.trainable = False
        elif options.lora_rank is not None:
            variable.trainable = "lora_kernel" in variable.path


def make_optimizer(options: LoopOptions, schedule: LinearWarmupDecay) -> keras.optimizers.Optimizer:
    clip = options.max_grad_norm if options.max_grad_norm > 0 else None
    if options.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=schedule, global_clipnorm=clip)
    optimizer = adamw(  # Keras' AdamW, same arithmetic, fewer temporaries (optimizer.py)
        learning_rate=schedule,
        weight_decay=options.weight_decay,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        global_clipnorm=clip,
    )
    # Hugging Face's Trainer decays every weight but biases and LayerNorm's.
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


def fingerprint(options: FinetuneOptions) -> dict[str, Any]:
    found = {name: getattr(options, name) for name in RESUME_FINGERPRINT}
    if options.lora_heads:  # named only when on: states saved before the option existed still resume
        found["lora_heads"] = True
    return found


class Run:
    """The pieces of one run, held together for its callbacks (saving needs the model, optimizer, source)."""

    def __init__(
        self,
        options: FinetuneOptions,
        files: CheckpointFiles,
        finetuner: M3Finetuner,
        parallel: data_parallel.Parallel = data_parallel.SINGLE,
    ) -> None:
        self.options = options
        self.files = files
        self.finetuner = finetuner
        self.parallel = parallel

    def save(self, step: int) -> None:
        """The model in BAAI's layout plus the training state after `step` steps, atomically."""
        sync = getattr(self.finetuner, "jax_state_sync", None)
        if callable(sync):
            sync()  # JAX keeps the training state outside the variables during fit()
        if not self.parallel.writes:
            return  # several hosts: the first writes (every host holds the same weights)
        finetuner, options = self.finetuner, self.options

        def extra(folder: Path) -> None:
            write_state(
                folder / STATE_DIR,
                finetuner,
                finetuner.optimizer,
                step=step,
                fingerprint=fingerprint(options),
            )
            if options.save_adapter:
                write_adapter(finetuner.encoder, folder, options)

        save_bgem3_checkpoint(
            finetuner.encoder,
            self.files.root,
            options.output_dir,
            overwrite=options.overwrite_output_dir or step > 0,
            extra=extra,
        )


def build_finetuner(
    files: CheckpointFiles,
    options: FinetuneOptions,
    total_steps: int,
    *,
    no_in_batch_neg: bool | str = False,
    device: DeviceChoice = CPU,
    devices: int = 1,
) -> tuple[M3Finetuner, LinearWarmupDecay]:
    """The model `options` describe, compiled with its optimizer (built, so a state can be restored), and
    the learning-rate schedule over `total_steps`: what `bgem3 finetune` trains and `bench --finetune` times.

    No global seed is set (keras.utils.set_random_seed would import TensorFlow on every backend): dropout,
    LoRA's initial factors and the data each draw from their own stream of options.seed.
    """
    prepare_training()  # where run_finetune did not (bench --finetune, the Python API)
    model, _ = build_model(files, precision="float32", device=device, weights_cache=False)
    if options.precision == "bfloat16":
        _mixed_bfloat16(model)
    hidden, attention = dropout_rates(files.config)
    dropout = EncoderDropout(hidden, attention, seed=options.seed, remat=options.gradient_checkpointing)
    finetuner = M3Finetuner(
        model,
        _loss_settings(options),
        group_size=options.train_group_size,
        no_in_batch_neg=no_in_batch_neg,
        dropout=dropout,
        # GradCache only where it splits a batch (TensorFlow's traced step cannot see the row count)
        sub_batch_size=_splitting(
            options.sub_batch_size, options.per_device_train_batch_size * options.train_group_size
        ),
        devices=devices,  # a data-parallel step's batch holds one block per device
        negatives_cross_device=options.negatives_cross_device,
    )
    choose_trainable(finetuner, options)
    return finetuner, compile_for(finetuner, options, total_steps)


def compile_for(finetuner: keras.Model, options: LoopOptions, total_steps: int) -> LinearWarmupDecay:
    """Compile `finetuner` with the optimizer `options` say, built (so a saved state can be restored), on
    the warmup-then-linear schedule over `total_steps`, which is returned."""
    warmup = round(options.warmup_ratio * total_steps)
    schedule = LinearWarmupDecay(options.learning_rate, warmup, total_steps)
    optimizer = make_optimizer(options, schedule)
    finetuner.compile(optimizer=optimizer)
    optimizer.build(finetuner.trainable_variables)
    return schedule


def run_finetune(
    options: FinetuneOptions, *, verbose: int = 0, callbacks: Sequence[Any] = ()
) -> FinetuneResult:
    """Train as `options` say; the tuned model ends in options.output_dir. See the module docstring."""
    prepare_training()  # before JAX's first computation (backends/jax/training_flags.py)
    parallel = data_parallel.start(options)  # before any variable exists (data_parallel.py)
    try:
        return _run_finetune(options, parallel, verbose, callbacks)
    finally:
        data_parallel.stop(parallel)


def _run_finetune(
    options: FinetuneOptions, parallel: data_parallel.Parallel, verbose: int, callbacks: Sequence[Any]
) -> FinetuneResult:
    files = resolve_checkpoint(options.model)
    check_heads(files, allow_missing_heads=False)
    data = read_training_data(
        options.train_data,
        knowledge_distillation=options.knowledge_distillation,
        skip_invalid=options.skip_invalid,
        train_group_size=options.train_group_size,
    )
    _check_data_fits(data, options)
    state = check_output(options)  # before any weights load
    kinds = {e.no_in_batch_neg for e in data.examples}
    plan = make_plan(data, options, parallel.devices)
    finetuner, schedule = build_finetuner(
        files,
        options,
        len(plan),
        no_in_batch_neg=MIXED if len(kinds) > 1 else kinds.pop(),
        device=parallel.device,
        devices=parallel.devices,
    )
    optimizer = finetuner.optimizer
    run = Run(options, files, finetuner, parallel)
    start = 0
    if state is not None:
        restore_state(state, finetuner, optimizer, fingerprint(options))
        start = state.step
    history: list[dict[str, float]] = []
    interrupted = False
    done = start
    if start < len(plan):
        tokenizer = BGEM3Tokenizer.from_dir(files.tokenizer_dir)
        source = StepBatches(
            plan,
            batch_maker(
                data,
                tokenizer,
                options,
                tokenize_batch,
                query_instruction_for_retrieval=options.query_instruction_for_retrieval,
            ),
            start_step=start,
            to_inputs=lambda batch, step: parallel.local_rows(model_inputs(batch, step)),
        )
        done, interrupted = fit_steps(
            finetuner,
            source,
            run,
            options,
            schedule,
            history,
            verbose=verbose,
            extra=[SparseCollapseWarning(options.unified_finetuning)],
            callbacks=callbacks,
        )
    run.save(done)
    return FinetuneResult(
        done, options.output_dir, interrupted, len(data.skipped), history, devices=parallel.devices
    )


def fit_steps(
    finetuner: keras.Model,
    source: StepBatches,
    run: Any,
    options: LoopOptions,
    schedule: LinearWarmupDecay,
    history: list[dict[str, float]],
    *,
    verbose: int = 0,
    extra: Sequence[Any] = (),
    callbacks: Sequence[Any] = (),
) -> tuple[int, bool]:
    """`fit()` over the source's steps with the loop's own callbacks (Ctrl-C stops after the step in
    progress, `run.save(step)` every save_steps, the model's `extra` ones, the JSON log into `history`),
    then the caller's `callbacks`.
    Returns (steps completed in all runs, whether Ctrl-C stopped it); the final save is the caller's."""
    start = source.start_step
    stopper = StopOnSignal()
    own = [
        stopper,
        CheckpointEvery(run, options.save_steps, start),
        *extra,
        JsonLog(options.log_json, source, start, schedule, history, resume=options.resume),
    ]
    previous = signal.signal(signal.SIGINT, stopper.request)
    try:
        finetuner.fit(
            fit_input(source),
            epochs=1,
            steps_per_epoch=len(source),
            verbose=verbose,
            callbacks=[*own, *callbacks],
            shuffle=False,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    return start + stopper.steps_done, stopper.requested


def check_output(options: LoopOptions) -> TrainingState | None:
    """The state to resume from (--resume), or None after checking that the output folder may be written."""
    if options.resume:
        return read_state(options.output_dir / STATE_DIR)
    if options.output_dir.exists() and not options.overwrite_output_dir:
        check_output_dir(options.output_dir, overwrite=False)
        if (options.output_dir / STATE_DIR).exists():
            raise TrainingStateError(
                f"{options.output_dir} holds a training run already: continue it with --resume, "
                "or start over with --overwrite-output-dir"
            )
    return None


def _splitting(sub_batch_size: int | None, passages: int) -> int | None:
    return sub_batch_size if sub_batch_size is not None and sub_batch_size < passages else None


def _loss_settings(options: FinetuneOptions) -> LossSettings:
    return LossSettings(
        temperature=options.temperature,
        unified=options.unified_finetuning,
        self_distill=options.use_self_distill,
        self_distill_start_step=options.self_distill_start_step,
        knowledge_distillation=options.knowledge_distillation,
        kd_loss_type=options.kd_loss_type,
    )


def _check_data_fits(data: TrainingData, options: FinetuneOptions) -> None:
    """What FlagEmbedding would fail on mid-run, said before anything trains."""
    flagged = [e.origin for e in data.examples if e.no_in_batch_neg]
    if flagged and options.knowledge_distillation and options.kd_loss_type == "m3_kd_loss":
        from bgem3_embeddings.finetune.data import TrainingDataError

        raise TrainingDataError(
            f"{flagged[0].rsplit(':', 1)[0]} is no_in_batch_neg data, where m3_kd_loss has no in-batch "
            "negatives to rank: use --kd-loss-type kl_div"
        )


def _mixed_bfloat16(model: Any) -> None:
    """bf16 matmuls, float32 weights and optimizer state (Keras' mixed_bfloat16 on the Dense layers)."""
    policy = keras.DTypePolicy("mixed_bfloat16")
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.Dense):
            layer.dtype_policy = policy
