"""The `bgem3 bench` command (registered in bgem3_embeddings/cli.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer


def bench(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Hub id or local checkpoint; default: a generated random-init checkpoint of the real size",
        ),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A 16-text corpus instead of 32.")] = False,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write all results to this JSON file.")
    ] = None,
    precision: Annotated[
        list[str] | None,
        typer.Option(
            "--precision",
            help="float32 / bfloat16 / float16 / int8, or WEIGHTS:COMPUTE; repeatable "
            "(default float32, bfloat16, bfloat16:bfloat16, int8)",
        ),
    ] = None,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            "--engine",
            help="keras / transformers / onnxruntime / keras-encode / flagembedding, or ours on another "
            "Keras backend (keras-jax, keras-torch) and KerasHub's XLM-RoBERTa on each (kerashub, "
            "kerashub-jax, kerashub-torch); repeatable (default: the first five)",
        ),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1)] = 256,
    max_tokens: Annotated[int, typer.Option(min=0, help="Token budget per batch (padded); 0: none.")] = 8192,
    repeats: Annotated[int, typer.Option(min=1, help="Timed passes per engine (best is kept).")] = 1,
    rounds: Annotated[
        int,
        typer.Option(
            min=1, help="Run every engine this many times, interleaved, in fresh processes (best kept)."
        ),
    ] = 1,
    long_tokens: Annotated[
        int,
        typer.Option(help="Also encode one passage of this many tokens (e.g. 8192) and report its peak RSS."),
    ] = 0,
    texts: Annotated[int | None, typer.Option(min=2, help="Corpus size (overrides --quick).")] = None,
    cache_dir: Annotated[Path, typer.Option(help="Where the random checkpoint is kept.")] = Path(
        ".cache/bench"
    ),
    dense_only: Annotated[
        bool,
        typer.Option(
            "--dense-only",
            help="Ours computes the dense vectors only (what KerasHub's embedder gives); with --finetune: "
            "dense-only fine-tuning on every row (default: unified, dense + sparse + ColBERT).",
        ),
    ] = False,
    device: Annotated[
        str,
        typer.Option(help="Where the Keras engines run: cpu, auto, metal, cuda, gpu (int8 and others: CPU)."),
    ] = "cpu",
    finetune: Annotated[
        bool,
        typer.Option(
            "--finetune",
            help="Time one training step instead: ours (full and LoRA, each Keras backend) beside "
            "FlagEmbedding's trainer, tokens/s and peak RSS, each row in its own process (CPU).",
        ),
    ] = False,
    per_device_train_batch_size: Annotated[int, typer.Option(min=1, help="--finetune: queries a step.")] = 16,
    train_group_size: Annotated[int, typer.Option(min=1, help="--finetune: passages per query.")] = 8,
    query_max_len: Annotated[int, typer.Option(min=3, help="--finetune: tokens of every query.")] = 32,
    passage_max_len: Annotated[int, typer.Option(min=3, help="--finetune: tokens of every passage.")] = 512,
    steps: Annotated[int, typer.Option(min=1, help="--finetune: timed steps after one warm-up step.")] = 1,
    lora_rank: Annotated[int, typer.Option(min=1, help="--finetune: the LoRA rows' rank.")] = 8,
    sub_batch_size: Annotated[
        int | None, typer.Option(min=1, help="--finetune: our rows train with GradCache in sub-batches of N.")
    ] = None,
    finetune_row: Annotated[
        list[str] | None,
        typer.Option(help="--finetune: run only these rows (e.g. keras-jax-lora-remat, flagembedding-gc); "
                     "repeatable"),
    ] = None,
    max_rss_gb: Annotated[
        float | None,
        typer.Option(min=0.1, help="--finetune: stop a row above this resident memory (default: 90% of the "
                     "memory available at start)"),
    ] = None,
) -> None:
    """Throughput, memory and start-up against transformers, ONNX Runtime (fp32, int8) and FlagEmbedding.

    The encoder alone; ingest into Qdrant end to end (chunk + encode + store): `bgem3-qdrant bench`."""
    from bgem3_embeddings.bench.report import format_report
    from bgem3_embeddings.bench.run import BenchOptions, run_bench
    from bgem3_embeddings.cli_support import check_inputs, require_modules

    if finetune:
        from bgem3_embeddings.bench.finetune_bench import DEFAULT_ROWS, FinetuneBenchOptions

        if model is not None:
            check_inputs(model)
        _bench_finetune(
            FinetuneBenchOptions(
                model=model, batch_size=per_device_train_batch_size, group_size=train_group_size,
                query_max_len=query_max_len, passage_max_len=passage_max_len, steps=steps,
                lora_rank=lora_rank, sub_batch_size=sub_batch_size, unified=not dense_only,
                rows=tuple(finetune_row) if finetune_row else DEFAULT_ROWS,
                max_rss_mb=max_rss_gb * 1024 if max_rss_gb is not None else None, cache_dir=cache_dir,
            ),
            json_out,
        )  # fmt: skip
        return
    # Before anything runs: the packages the asked-for engines need (the bench extra), the checkpoint.
    chosen = set(engine or BenchOptions().engines)
    needed = ["torch"] if chosen & {"transformers", "onnxruntime"} or model is None else []
    needed += ["onnx", "onnxruntime"] if "onnxruntime" in chosen else []
    require_modules(needed, "bgem3 bench (the bench extra)", "pip install \"bgem3-embeddings[bench]\"")
    _require_keras_engines(chosen)
    if model is not None:
        check_inputs(model)

    logging.getLogger("bgem3_embeddings").setLevel(logging.INFO)
    defaults = BenchOptions()
    options = BenchOptions(
        model=model,
        quick=quick,
        batch_size=batch_size,
        max_tokens=max_tokens or None,
        repeats=repeats,
        rounds=rounds,
        precisions=tuple(precision) if precision else defaults.precisions,
        engines=tuple(engine) if engine else defaults.engines,
        long_tokens=long_tokens,
        cache_dir=cache_dir,
        texts=texts,
        device=device,
        dense_only=dense_only,
    )
    _run_and_report(run_bench, options, format_report, json_out)


def _run_and_report(run: Any, options: Any, report: Any, json_out: Path | None) -> None:
    """run(options) with progress on stderr; the report on stdout, every figure to --json. A model path
    that turns out missing is the --model option's one line."""
    try:
        result = run(options, progress=lambda message: typer.echo(message, err=True))
    except FileNotFoundError as err:
        raise typer.BadParameter(str(err), param_hint="--model") from err
    typer.echo(report(result))
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1))
        typer.echo(f"wrote {json_out}", err=True)


def _bench_finetune(options: Any, json_out: Path | None) -> None:
    """`bgem3 bench --finetune`: the rows, the table, the JSON."""
    from bgem3_embeddings.bench.finetune_bench import plan_rows, run_finetune_bench
    from bgem3_embeddings.bench.finetune_report import format_finetune_report

    try:
        plan_rows(options.rows)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--finetune-row") from err
    logging.getLogger("bgem3_embeddings").setLevel(logging.INFO)
    _run_and_report(run_finetune_bench, options, format_finetune_report, json_out)


def _require_keras_engines(chosen: set[str]) -> None:
    """One line naming what to install for the Keras-backend engines asked for: found, not imported (an
    import of JAX or KerasHub here would start a backend in this process, beside the workers)."""
    import importlib.util

    from bgem3_embeddings.bench.worker import KERASHUB_ON, engine_backend
    from bgem3_embeddings.cli_support import CommandError

    installs = {
        "jax": 'pip install "bgem3-embeddings[jax]"',
        "torch": 'pip install "bgem3-embeddings[torch]"',
        "keras_hub": "pip install --no-deps keras-hub==0.32.0 (--no-deps: its tensorflow-text would change "
        "TensorFlow)",
    }
    for engine in sorted(chosen):
        backend = engine_backend(engine)
        modules = [backend] if backend in ("jax", "torch") else []
        modules += ["keras_hub"] if engine in KERASHUB_ON.values() else []
        for module in modules:
            if importlib.util.find_spec(module) is None:
                raise CommandError(
                    f"bgem3 bench --engine {engine} needs {module}, not installed: {installs[module]}"
                )
