"""`bgem3 bench --finetune`: every row runs on the tiny checkpoint, trains the same batch, and the table's
ratios are the measured figures divided.

One run of the command (module fixture: 11 rows, each a process of its own; about 2 minutes on 2 busy vCPUs)
on a copy of the tiny checkpoint with dropout 0, so every row computes the same function: the first step's
loss (before any update) is then equal on every row, which holds ours on three backends and FlagEmbedding's
trainer to the same batch, the same loss settings and the same weights; after one AdamW step the full
fine-tuning rows still agree with FlagEmbedding's (the same optimizer, learning rate and clipping).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bgem3_embeddings.bench.finetune_bench import (
    DEFAULT_ROWS,
    FinetuneBenchOptions,
    add_ratios,
    installed,
    plan_rows,
    refused_allocation_mb,
    run_guarded,
)
from bgem3_embeddings.bench.finetune_report import COLUMNS
from tests.optional import require_module, skip_or_fail

QUERIES, GROUP, QUERY_TOKENS, PASSAGE_TOKENS = 2, 2, 8, 16
TOKENS_PER_STEP = QUERIES * QUERY_TOKENS + QUERIES * GROUP * PASSAGE_TOKENS


@pytest.fixture(scope="module")
def bench(
    no_dropout_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[str, Any]]:
    """(the printed report, the --json result) of one `bgem3 bench --finetune` run at tiny sizes."""
    for module in ("torch", "jax", "datasets"):
        require_module(module, reason="every row of the fine-tuning bench runs here (the dev extra)")
    if not installed("FlagEmbedding"):  # its package __init__ fails on transformers 5
        skip_or_fail("FlagEmbedding is not installed (the dev extra)")
    out = tmp_path_factory.mktemp("finetune_bench_out") / "result.json"
    command = [
        sys.executable, "-m", "bgem3_embeddings.cli", "bench", "--finetune",
        "--model", str(no_dropout_checkpoint),
        "--per-device-train-batch-size", str(QUERIES), "--train-group-size", str(GROUP),
        "--query-max-len", str(QUERY_TOKENS), "--passage-max-len", str(PASSAGE_TOKENS), "--steps", "1",
        "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def parse_table(report: str) -> dict[str, dict[str, str]]:
    """The table's rows as {row: {column: cell}}, read back by splitting on spaces."""
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["row", "backend"])
    names = lines[header].split()
    assert names == [name for name, _ in COLUMNS]
    rows = {}
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        if line.startswith(("note:", "not run:")):
            continue
        cells = line.split()
        assert len(cells) == len(names), line
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows


def test_every_row_runs_on_the_same_batch(bench: tuple[str, dict]) -> None:
    _, result = bench
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows) == list(DEFAULT_ROWS)
    assert not [r["error"] for r in rows.values() if "error" in r]
    assert result["batch"] == {
        "queries": QUERIES, "group_size": GROUP, "query_tokens": QUERY_TOKENS,
        "passage_tokens": PASSAGE_TOKENS, "tokens_per_step": TOKENS_PER_STEP,
    }  # fmt: skip
    first = rows["flagembedding"]["losses"][0]
    for name, row in rows.items():
        # Dropout 0: the first step's loss is one function of the same weights and batch on every row.
        assert row["losses"][0] == pytest.approx(first, rel=1e-5), name
        assert row["tokens_per_step"] == TOKENS_PER_STEP
        assert row["tokens_per_s"] == pytest.approx(TOKENS_PER_STEP / row["step_s"][0])
        assert row["rss_start_mb"] < row["rss_loaded_mb"] <= row["peak_rss_mb"]
        assert row["peak_rss_mb"] == max(row["peak_rss_warmup_mb"], row["peak_rss_steps_mb"])
    # One AdamW step later, full fine-tuning is still where FlagEmbedding's trainer is (same update rule,
    # learning rate, clipping); LoRA moved only the adapters and heads, so its loss differs.
    after = rows["flagembedding"]["losses"][1]
    for backend in ("keras", "keras-jax", "keras-torch"):
        assert rows[f"{backend}-full"]["losses"][1] == pytest.approx(after, rel=1e-4)
        assert rows[f"{backend}-lora"]["losses"][1] != pytest.approx(after, rel=1e-4)
    # LoRA trains the adapters and heads, a small part of what full fine-tuning trains.
    assert rows["keras-lora"]["trainable_params"] < rows["keras-full"]["trainable_params"] / 4
    # FlagEmbedding's encoder holds the pooler too (AutoModel loads it; the loss never reaches it).
    hidden = json.loads((Path(result["model"]) / "config.json").read_text())["hidden_size"]
    pooler = hidden * hidden + hidden
    assert rows["flagembedding"]["trainable_params"] == rows["keras-full"]["trainable_params"] + pooler


def test_ratios_are_the_measured_figures_divided(bench: tuple[str, dict]) -> None:
    report, result = bench
    rows = {r["row"]: r for r in result["rows"]}
    table = parse_table(report)
    assert list(table) == list(DEFAULT_ROWS)
    for name, row in rows.items():
        printed = table[name]
        assert float(printed["tok/s"]) == pytest.approx(row["tokens_per_s"], abs=0.06)
        assert float(printed["peak_RSS_MB"]) == pytest.approx(row["peak_rss_mb"], abs=0.6)
        if row["engine"] == "flagembedding":
            assert printed["tok/s_vs_FE"] == printed["RSS_vs_FE"] == "-"
            continue
        theirs = rows["flagembedding-gc" if row["checkpointing"] else "flagembedding"]
        assert row["vs"] == theirs["row"]
        speed = row["tokens_per_s"] / theirs["tokens_per_s"]
        memory = row["peak_rss_mb"] / theirs["peak_rss_mb"]
        assert row["tokens_per_s_vs_flagembedding"] == pytest.approx(speed)
        assert row["peak_rss_vs_flagembedding"] == pytest.approx(memory)
        assert printed["tok/s_vs_FE"] == f"{speed:.2f}x"
        assert printed["RSS_vs_FE"] == f"{memory:.2f}x"
    speeds = {b: rows[f"{b}-full"]["tokens_per_s_vs_flagembedding"] for b in ("keras", "keras-torch")}
    full = [f"{b}-full {speed:.2f}x" for b, speed in speeds.items()]
    target = next(line for line in report.splitlines() if line.startswith("target (issue 56"))
    assert all(figure in target for figure in full), target


def test_the_report_names_the_machine(bench: tuple[str, dict]) -> None:
    report, result = bench
    lines = report.splitlines()
    cpu = next(line for line in lines if line.startswith("CPU: "))
    assert "usable CPUs" in cpu and result["cpu"] in cpu
    assert any(line.startswith("device: the CPU alone, no GPU used") for line in lines)
    assert f"{TOKENS_PER_STEP} tokens a step" in report and "unified fine-tuning" in report


def test_rows_are_named_and_missing_packages_said() -> None:
    with pytest.raises(ValueError, match="unknown row keras-nope: one of keras-full"):
        plan_rows(("keras-nope",))
    rows, skipped = plan_rows(("keras-full", "keras-jax-lora", "flagembedding"), have=lambda m: m != "jax")
    assert [r.name for r in rows] == ["keras-full", "flagembedding"]
    assert skipped == ["keras-jax-lora: not run, jax not installed"]
    assert "keras-jax-full-remat" not in DEFAULT_ROWS and plan_rows(("keras-jax-full-remat",))[0][0].remat
    assert FinetuneBenchOptions().batch_size == 16 and FinetuneBenchOptions().passage_max_len == 512


def test_a_row_over_the_memory_limit_is_stopped() -> None:
    """A process that grows past the limit is killed as it passes it, not left to the kernel's OOM killer
    (this one stops growing at 600 MB and waits: unguarded, only the timeout would end it)."""
    grow = "import time\nb = [b'x' * 50 * 2**20 for _ in range(12) if not time.sleep(0.05)]\ntime.sleep(60)"
    started = time.monotonic()
    code, _, stopped_at = run_guarded([sys.executable, "-c", grow], {}, max_rss_mb=200, timeout_s=30)
    assert code < 0 and stopped_at is not None and stopped_at > 200
    assert time.monotonic() - started < 15


def test_a_stopped_reference_bounds_the_memory_ratio() -> None:
    ours = {"row": "keras-full", "engine": "ours", "checkpointing": False, "tokens_per_s": 10.0,
            "peak_rss_mb": 3000.0}  # fmt: skip
    theirs = {"row": "flagembedding", "engine": "flagembedding", "checkpointing": False, "error": "stopped",
              "stopped_over_mb": 12000.0}  # fmt: skip
    add_ratios([ours, theirs])
    assert ours["peak_rss_vs_flagembedding_below"] == pytest.approx(0.25)
    assert "tokens_per_s_vs_flagembedding" not in ours


def test_a_refused_allocation_bounds_the_memory_ratio() -> None:
    """torch's own error for an allocation the machine cannot give (FlagEmbedding's (128, 512, 250,002)
    scatter at the issue's batch asked for 65,536,524,288 bytes): the size is a lower bound of its peak."""
    require_module("torch", reason="torch's allocator error")
    ask = "import torch; torch.zeros(2**62, dtype=torch.uint8)"  # 4 EiB: refused at once, nothing touched
    code, stderr, stopped_at = run_guarded([sys.executable, "-c", ask], {}, max_rss_mb=None, timeout_s=60)
    assert code == 1 and stopped_at is None
    assert refused_allocation_mb(stderr) == 2**62 / 2**20
    assert refused_allocation_mb("RESOURCE_EXHAUSTED: Out of memory allocating 28098101000 bytes.") == (
        28098101000 / 2**20
    )
    assert refused_allocation_mb("Traceback ... ValueError: no allocation here") is None


def test_an_unknown_row_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bgem3_embeddings.cli", "bench", "--finetune", "--finetune-row", "keras-nope"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "keras-nope" in done.stderr and "Traceback" not in done.stderr
