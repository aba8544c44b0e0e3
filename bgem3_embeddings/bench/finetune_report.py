"""Plain-text report of `bgem3 bench --finetune` (the dict run_finetune_bench returns), in report.py's style.

One row per line, columns split by spaces (no value holds one), so the table reads back as it prints.
"""

from __future__ import annotations

from typing import Any

from bgem3_embeddings.bench.report import _f

# Issue 56's targets on a CPU for full fine-tuning: at least this much FlagEmbedding's tokens/s, at most this
# much its peak memory.
TARGET_SPEED, TARGET_MEMORY = 1.2, 0.6
COLUMNS = (
    ("row", "<24"), ("backend", "<12"), ("trains", "<12"), ("ckpt", "<6"), ("tok/s", ">10"), ("step_s", ">9"),
    ("first_s", ">9"), ("peak_RSS_MB", ">13"), ("tok/s_vs_FE", ">13"), ("RSS_vs_FE", ">11"), ("loss", ">10"),
)  # fmt: skip


def _cells(values: list[str]) -> str:
    """The first len(values) columns, each at its width."""
    return "".join(format(v, spec) for v, (_, spec) in zip(values, COLUMNS[: len(values)], strict=True))


def row_line(r: dict[str, Any]) -> str:
    """A row of the table: its figures, or 'failed: why'."""
    left = [r["row"], r["backend"], r["trains"].replace(" ", ""), "on" if r["checkpointing"] else "off"]
    if "error" in r:
        return f"{_cells(left)}failed: {r['error']}"
    memory = _memory_ratio(r)
    return _cells([
        *left, f"{r['tokens_per_s']:.1f}", f"{sum(r['step_s']) / len(r['step_s']):.2f}",
        f"{r['first_step_s']:.2f}", f"{r['peak_rss_mb']:.0f}",
        _f(r.get("tokens_per_s_vs_flagembedding"), "{:.2f}x"), memory, f"{r['losses'][-1]:.4f}",
    ])  # fmt: skip


def _notes(rows: list[dict[str, Any]]) -> list[str]:
    notes = []
    for r in rows:
        if r.get("keras_backend") in ("jax", "torch") and r.get("tensorflow_imported"):
            notes.append(f"{r['row']} ran on {r['keras_backend']}, yet its process imported TensorFlow")
        if "peak_rss_vs_flagembedding_below" in r:
            notes.append(
                f"{r['row']}: {r['vs']} passed the memory limit or was refused one allocation: ours is below "
                "that fraction of the limit or of the allocation alone"
            )
    return notes


def _memory_ratio(r: dict[str, Any]) -> str:
    """Ours / FlagEmbedding's peak, or "<x" where theirs passed the limit or was refused an allocation."""
    below = r.get("peak_rss_vs_flagembedding_below")
    return f"<{below:.2f}x" if below is not None else _f(r.get("peak_rss_vs_flagembedding"), "{:.2f}x")


def _target_line(rows: list[dict[str, Any]]) -> str:
    full = [r for r in rows if r["engine"] == "ours" and r["trains"] == "all"]
    figures = [
        f"{r['row']} {_f(r.get('tokens_per_s_vs_flagembedding'), '{:.2f}x')} / {_memory_ratio(r)}"
        for r in full
        if "error" not in r
    ]
    return (
        f"target (issue 56, CPU): full fine-tuning >= {TARGET_SPEED:.1f}x FlagEmbedding's tok/s and <= "
        f"{TARGET_MEMORY:.1f}x its peak RSS: " + ("; ".join(figures) or "no full fine-tuning row measured")
    )


def format_finetune_report(result: dict[str, Any]) -> str:
    b = result["batch"]
    mode = "unified fine-tuning (dense + sparse + ColBERT)" if result["unified"] else "dense only"
    limit = result.get("max_rss_mb")
    passages = b["queries"] * b["group_size"]
    lines = [
        f"model: {result['model']}{' (random init, real size and layout)' if result['random_init'] else ''}",
        f"batch: {b['queries']} queries x group {b['group_size']} ({passages} passages) "
        f"of {b['passage_tokens']} tokens, queries of {b['query_tokens']}: {b['tokens_per_step']:,} tokens a "
        f"step; {mode}; AdamW, LoRA rank {result['lora_rank']}; 1 warm-up step, then {result['steps']} timed",
        f"CPU: {result['cpu']}; load average {result['loadavg_start']:.1f} at start, "
        f"{result['loadavg_end']:.1f} at end (figures from a busy machine are low and noisy)",
        "device: the CPU alone, no GPU used (benchmarks/gpu_check.py times a training step on a GPU)",
        "memory limit per row: " + (f"{limit:.0f} MB resident" if limit else "none"),
    ]
    header = _cells([name for name, _ in COLUMNS])
    lines += ["", header, "-" * len(header)]
    lines += [row_line(r) for r in result["rows"]]
    lines += [f"not run: {line}" for line in result.get("skipped", [])]
    lines += [f"note: {n}" for n in _notes(result["rows"])]
    lines += [
        "",
        "tok/s: real tokens (queries + passages) per second of a timed step (forward, backward, optimizer); "
        "step_s: its mean; first_s: the warm-up step (tracing, compilation); peak_RSS_MB: the row's process "
        "at its peak; *_vs_FE: ours / FlagEmbedding's row with the same checkpointing (ckpt: our remat, its "
        "gradient checkpointing); loss: the last step's",
        _target_line(result["rows"]),
    ]
    return "\n".join(lines)
