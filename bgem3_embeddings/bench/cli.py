"""The `bgem3 bench` command (registered in bgem3_embeddings/cli.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

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
            "--dense-only", help="Ours computes the dense vectors only (what KerasHub's embedder gives)."
        ),
    ] = False,
    device: Annotated[
        str,
        typer.Option(help="Where the Keras engines run: cpu, auto, metal, cuda, gpu (int8 and others: CPU)."),
    ] = "cpu",
) -> None:
    """Throughput, memory and start-up against transformers, ONNX Runtime (fp32, int8) and FlagEmbedding."""
    from bgem3_embeddings.bench.report import format_report
    from bgem3_embeddings.bench.run import BenchOptions, run_bench
    from bgem3_embeddings.cli_support import check_inputs, require_modules

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
    try:
        result = run_bench(options, progress=lambda message: typer.echo(message, err=True))
    except FileNotFoundError as err:
        raise typer.BadParameter(str(err), param_hint="--model") from err
    typer.echo(format_report(result))
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=1))
        typer.echo(f"wrote {json_out}", err=True)


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
