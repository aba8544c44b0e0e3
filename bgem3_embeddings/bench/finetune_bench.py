"""`bgem3 bench --finetune`: a training step's tokens/s and peak memory, ours beside FlagEmbedding's trainer.

The batch is fixed and shared: B queries, each with a group of G passages (1 positive + G-1 negatives), every
query exactly --query-max-len tokens and every passage exactly --passage-max-len tokens (seeded multilingual
text, cut by the checkpoint's tokenizer), so each row does the same work. Each row runs in a fresh process
(finetune_step.py), one after the other:

    keras-full, keras-jax-full, keras-torch-full         ours, every weight trains, AdamW
    keras-lora, keras-lora-remat, ... (each backend)     ours, LoRA adapters + the heads, remat off / on
    flagembedding, flagembedding-gc                      FlagEmbedding's trainer model + torch AdamW,
                                                         gradient checkpointing off / on

(and keras[-jax|-torch]-full-remat when asked for by name). Every row's ratio divides by the FlagEmbedding row
with the same gradient checkpointing. A row whose resident memory passes the limit is stopped and reported as
such (full-size batches without checkpointing can need more memory than the machine has), never left to the
kernel's out-of-memory killer.

    result = run_finetune_bench(FinetuneBenchOptions(model="tiny", batch_size=2, group_size=2,
                                                     passage_max_len=16, query_max_len=8))
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.bench.finetune_step import save_batch
from bgem3_embeddings.bench.worker import KERAS_BACKENDS, OURS_ON

logger = logging.getLogger(__name__)
ROW_TIMEOUT_S = 6 * 3600  # a full-size step on a laptop CPU takes many minutes; with remat more
POLL_S = 0.2
# The CPU features that decide the matmul kernels (the report's CPU line names those present).
CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")


@dataclass(frozen=True)
class Row:
    name: str
    engine: str  # "ours" or "flagembedding"
    backend: str  # the Keras backend; "torch" for FlagEmbedding
    lora: bool
    remat: bool  # ours: EncoderDropout(remat=True); FlagEmbedding: gradient_checkpointing_enable()


def all_rows() -> dict[str, Row]:
    """Every row the bench knows, by name."""
    rows = {}
    for backend in KERAS_BACKENDS:
        for mode, lora, remat in (("full", False, False), ("full-remat", False, True), ("lora", True, False),
                                  ("lora-remat", True, True)):  # fmt: skip
            name = f"{OURS_ON[backend]}-{mode}"
            rows[name] = Row(name, "ours", backend, lora, remat)
    rows["flagembedding"] = Row("flagembedding", "flagembedding", "torch", False, False)
    rows["flagembedding-gc"] = Row("flagembedding-gc", "flagembedding", "torch", False, True)
    return rows


# What runs without --finetune-row: full fine-tuning and LoRA (remat off and on) per backend, FlagEmbedding's
# gradient checkpointing off and on.
DEFAULT_ROWS = tuple(name for name in all_rows() if not name.endswith("full-remat"))


@dataclass(frozen=True)
class FinetuneBenchOptions:
    model: str | None = None  # None: a random-init checkpoint of the real size (bench/run.py generates it)
    batch_size: int = 16  # queries per step
    group_size: int = 8  # passages per query
    query_max_len: int = 32
    passage_max_len: int = 512
    steps: int = 1  # timed steps, after one warm-up step
    lora_rank: int = 8
    # ours: GradCache's rows per encoder pass (bgem3 finetune --sub-batch-size)
    sub_batch_size: int | None = None
    unified: bool = True  # --unified-finetuning (dense + sparse + ColBERT); False: dense only
    rows: tuple[str, ...] = DEFAULT_ROWS
    max_rss_mb: float | None = None  # stop a row above this; None: 90% of the memory available at start
    cache_dir: Path = field(default_factory=lambda: Path(".cache") / "bench")
    seed: int = 0


# ------------------------------------------------------------------------------------------------ plan
def installed(module: str) -> bool:
    """Whether `module` can be imported. A module already in sys.modules counts: FlagEmbedding's stand-in
    package (flagembedding_modules.py) has no spec, and find_spec raises ValueError on it."""
    if module in sys.modules:
        return True
    return importlib.util.find_spec(module) is not None


def plan_rows(names: tuple[str, ...], have: Callable[[str], bool] = installed) -> tuple[list[Row], list[str]]:
    """(the rows to run, a line for each left out because a package is missing); ValueError for an unknown
    name."""
    known = all_rows()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown row {', '.join(unknown)}: one of {', '.join(known)}")
    rows, skipped = [], []
    for name in names:
        row = known[name]
        flag = row.engine == "flagembedding"
        needed = ["torch", "transformers", "FlagEmbedding"] if flag else [row.backend]
        missing = [m for m in needed if not have(m)]
        if missing:
            skipped.append(f"{name}: not run, {' and '.join(missing)} not installed")
        else:
            rows.append(row)
    return rows, skipped


# ------------------------------------------------------------------------------------------------ batch
def fixed_batch(tokenizer: Any, options: FinetuneBenchOptions) -> Any:
    """The step's TrainBatch: every query exactly query_max_len tokens, every passage passage_max_len."""
    from bgem3_embeddings.bench.corpus import _draft_text as draft_text
    from bgem3_embeddings.finetune.batches import tokenize_batch
    from bgem3_embeddings.finetune.data import SampledGroup

    rng = np.random.default_rng(options.seed)

    def text(tokens: int) -> str:
        words = tokens
        while True:  # a text long enough to be cut at `tokens` (special tokens included)
            draft = draft_text(rng, words)
            if len(tokenizer.encode_batch([draft], max_length=tokens + 1)[0]) > tokens:
                return draft
            words *= 2

    groups = [
        SampledGroup(
            text(options.query_max_len),
            [text(options.passage_max_len) for _ in range(options.group_size)],
            teacher_scores=None,
        )
        for _ in range(options.batch_size)
    ]
    return tokenize_batch(
        tokenizer, groups, query_max_len=options.query_max_len, passage_max_len=options.passage_max_len
    )


# ------------------------------------------------------------------------------------------------ machine
def cpu_line() -> str:
    """The CPU's model name, the usable CPUs and the matmul-relevant feature flags (/proc/cpuinfo)."""
    from bgem3_embeddings.bench.run import usable_cpu_count
    from bgem3_embeddings.devices import read_cpu_flags

    name = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    flags = read_cpu_flags()
    present = [f for f in CPU_FEATURES if f in flags]
    absent = [f for f in CPU_FEATURES if f not in flags]
    return (
        f"{name}; {usable_cpu_count()} usable CPUs; flags: {' '.join(present) or '-'}"
        + (f" (no {', no '.join(absent)})" if absent and flags else "")
    )


def available_memory_mb() -> float | None:
    """MemAvailable from /proc/meminfo (MB); None where there is no /proc."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def process_rss_mb(pid: int) -> float | None:
    """Another process's resident memory (MB), None once it is gone or without /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# ------------------------------------------------------------------------------------------------ running
def run_guarded(command: list[str], env: dict[str, str], max_rss_mb: float | None,
                timeout_s: float = ROW_TIMEOUT_S) -> tuple[int, str, float | None]:
    """Run `command`; stop it when its resident memory passes `max_rss_mb` or it runs past `timeout_s`.
    Returns (exit status, its stderr, the RSS (MB) it was stopped at, or None when it ended by itself)."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        deadline = time.monotonic() + timeout_s
        stopped_at = None
        while proc.poll() is None:
            rss = process_rss_mb(proc.pid)
            if max_rss_mb is not None and rss is not None and rss > max_rss_mb:
                stopped_at = rss
                proc.kill()
            elif time.monotonic() > deadline:
                proc.kill()
            time.sleep(POLL_S)
        proc.wait()
        err.seek(0)
        return proc.returncode, err.read(), stopped_at


def run_row(row: Row, base: dict, workdir: Path, max_rss_mb: float | None) -> dict[str, Any]:
    """One row in a fresh interpreter; a row that fails or is stopped is reported, not fatal."""
    spec = {**base, "row": row.name, "engine": row.engine, "backend": row.backend, "remat": row.remat,
            "lora_rank": base["lora_rank"] if row.lora else None}  # fmt: skip
    spec_path, out_path = workdir / f"{row.name}.spec.json", workdir / f"{row.name}.result.json"
    spec_path.write_text(json.dumps(spec))
    # The CPU alone: every row measures the same device (the GPU has benchmarks/gpu_check.py).
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu",
           "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}  # fmt: skip
    if row.engine == "ours":
        env["KERAS_BACKEND"] = row.backend
    command = [sys.executable, "-m", "bgem3_embeddings.bench.finetune_step", str(spec_path), str(out_path)]
    started = time.perf_counter()
    code, stderr, stopped_at = run_guarded(command, env, max_rss_mb)
    described = {**describe(row), "process_s": time.perf_counter() - started}
    if stopped_at is not None:
        return {**described, "error": f"stopped at {stopped_at:.0f} MB resident, over the limit of "
                f"{max_rss_mb:.0f} MB", "stopped_over_mb": max_rss_mb}  # fmt: skip
    if code != 0 or not out_path.is_file():
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        cause = f"killed by signal {-code}" if code < 0 else f"exit {code}"
        failed = {**described, "error": f"{cause}: {tail}" if tail else cause}
        refused = refused_allocation_mb(stderr)
        # One allocation the machine refused: the row needed at least that much (a lower bound of its peak).
        return {**failed, "stopped_over_mb": refused} if refused is not None else failed
    return {**described, **json.loads(out_path.read_text())}


def refused_allocation_mb(stderr: str) -> float | None:
    """The size of an allocation the framework reported it could not make (torch's DefaultCPUAllocator,
    XLA's RESOURCE_EXHAUSTED), in MB; None when stderr names none.

    >>> refused_allocation_mb("can't allocate memory: you tried to allocate 65536524288 bytes. Error code 12")
    62500.5
    """
    found = re.search(r"(?:tried to allocate|Out of memory allocating) (\d+) bytes", stderr)
    return int(found.group(1)) / 2**20 if found else None


def describe(row: Row) -> dict[str, Any]:
    """What a row is, in the report's words."""
    return {"row": row.name, "engine": row.engine, "backend": row.backend,
            "trains": "LoRA + heads" if row.lora else "all", "checkpointing": row.remat}  # fmt: skip


def add_ratios(rows: list[dict]) -> None:
    """Each of our rows against FlagEmbedding's row with the same gradient checkpointing: tokens/s ours /
    theirs (above 1: ours faster) and peak RSS ours / theirs (below 1: ours smaller)."""
    theirs = {r["checkpointing"]: r for r in rows if r["engine"] == "flagembedding"}
    for row in rows:
        ref = theirs.get(row["checkpointing"])
        if row["engine"] != "ours" or ref is None or "error" in row:
            continue
        row["vs"] = ref["row"]
        if "error" not in ref:
            row["tokens_per_s_vs_flagembedding"] = row["tokens_per_s"] / ref["tokens_per_s"]
            row["peak_rss_vs_flagembedding"] = row["peak_rss_mb"] / ref["peak_rss_mb"]
        elif "stopped_over_mb" in ref:  # theirs needed more than the limit: ours is below this fraction
            row["peak_rss_vs_flagembedding_below"] = row["peak_rss_mb"] / ref["stopped_over_mb"]


def run_finetune_bench(options: FinetuneBenchOptions, progress: Callable[[str], None] | None = None) -> dict:
    """Everything `bgem3 bench --finetune` prints, as one dict (also what --json writes)."""
    from bgem3_embeddings.bench.run import BenchOptions, resolve_model
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    say = progress or (lambda message: None)
    rows, skipped = plan_rows(options.rows)
    for line in skipped:
        logger.warning("%s", line)
    model = resolve_model(BenchOptions(model=options.model, cache_dir=options.cache_dir))
    batch = fixed_batch(BGEM3Tokenizer.from_dir(model), options)
    available = available_memory_mb()
    limit = options.max_rss_mb
    if limit is None and available is not None:
        limit = 0.9 * available
    result: dict[str, Any] = {
        "model": str(model),
        "random_init": options.model is None,
        "batch": {"queries": batch.batch_size, "group_size": batch.group_size,
                  "query_tokens": int(batch.query_input_ids.shape[1]),
                  "passage_tokens": int(batch.passage_input_ids.shape[1]), "tokens_per_step": batch.tokens},
        "unified": options.unified,
        "lora_rank": options.lora_rank,
        "sub_batch_size": options.sub_batch_size,
        "steps": options.steps,
        "cpu": cpu_line(),
        "memory_available_mb": available,
        "max_rss_mb": limit,
        "skipped": skipped,
        "python": sys.version.split()[0],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg_start": os.getloadavg()[0],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bgem3-finetune-bench-") as tmp:
        workdir = Path(tmp)
        save_batch(workdir / "batch.npz", batch)
        base = {"model": str(model), "batch": str(workdir / "batch.npz"), "steps": options.steps,
                "unified": options.unified, "lora_rank": options.lora_rank, "device": "cpu",
                "sub_batch_size": options.sub_batch_size}  # fmt: skip
        measured = []
        for row in rows:
            say(f"running {row.name}")
            measured.append(run_row(row, base, workdir, limit))
    add_ratios(measured)
    result["rows"] = measured
    result["loadavg_end"] = os.getloadavg()[0]
    return result
