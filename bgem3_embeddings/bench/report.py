"""Plain-text report of a bench result (the dict run_bench returns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _f(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _convert_line(c: dict[str, Any]) -> str:
    return (
        f"int8 conversion (before the timed runs; cached): {c['seconds']:.1f} s, "
        f"peak RSS {c['peak_rss_mb']:.0f} MB"
    )


def _startup_line(s: dict[str, Any]) -> str:
    return (
        f"start-up (fresh process, {s['precision']}): import {s['import_s']:.2f} s, "
        f"construction {s['construct_s']:.2f} s, first vector {s['first_vector_s']:.2f} s "
        f"(second {s['second_vector_s']:.2f} s)"
    )


def _long_line(long: dict[str, Any]) -> str:
    return (
        f"long input: one {long['long_tokens']}-token passage in {long['wall_s']:.1f} s; "
        f"model resident {long['rss_loaded_mb']:.0f} MB, peak {long['peak_rss_encode_mb']:.0f} MB "
        f"(+{long['peak_above_loaded_mb']:.0f} MB)"
    )


def _backend_lines(entries: list[dict[str, Any]]) -> list[str]:
    """Ours beside KerasHub's XLM-RoBERTa on each Keras backend: tokens/s and the ratio ours / KerasHub."""
    header = f"{'keras backend':<15}{'ours tok/s':>12}{'KerasHub tok/s':>16}{'ours/KerasHub':>15}"
    header += f"{'(cpu time)':>12}"
    lines = [f"ours vs KerasHub, same backend, same token ids ({entries[0]['precision']}):", header]
    for e in entries:
        lines.append(
            f"{e['backend']:<15}{_f(e['ours_tokens_per_s']):>12}{_f(e['kerashub_tokens_per_s']):>16}"
            f"{_f(e['ratio'], '{:.2f}x'):>15}{_f(e['ratio_cpu_time'], '{:.2f}x'):>12}"
        )
    return lines


# Steps run beside the engines: (result key, label for a failure, the line for its figures).
_SIDE_STEPS: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("int8_convert", "int8 conversion", _convert_line),
    ("startup", "start-up", _startup_line),
    ("long_input", "long input", _long_line),
)


def engine_notes(row: dict) -> list[str]:
    """What a reader must know to read an engine's row: a TensorFlow import on another backend, and a
    % of peak above 100 (GFLOP/s counts the padded batches every engine is given; our runners compute
    fewer padded tokens where they split a batch of mixed lengths, backends/portable/sub_batches.py)."""
    notes = []
    if row.get("keras_backend") in ("jax", "torch") and row.get("tensorflow_imported"):
        notes.append(f"{row['engine']} ran on {row['keras_backend']}, yet its process imported TensorFlow")
    if (row.get("peak_fraction") or 0) > 1:
        notes.append(
            f"{row['engine']} ran above the matmul peak: GFLOP/s counts the padded batches all engines are "
            "given, and it computed fewer padded tokens (on the CPU ours splits a batch of mixed lengths)"
        )
    return notes


def format_report(result: dict[str, Any]) -> str:
    c = result["corpus"]
    lines = [
        f"model: {result['model']}{' (random init, real size and layout)' if result['random_init'] else ''}",
        f"corpus: {c['texts']} texts, {c['tokens']} tokens ({c['min_tokens']}-{c['max_tokens']} per text), "
        f"{c['batches']} batches, {c['padded_tokens']} padded tokens; "
        f"batch_size {result['batching']['batch_size']}"
        f", max_tokens {result['batching']['max_tokens']}",
        f"machine: {result['cpus']} CPUs, load average {result['loadavg_start']:.1f} at start, "
        f"{result['loadavg_end']:.1f} at end (figures from a busy machine are low and noisy)",
        f"keras engines on: {result.get('device', 'cpu')}"
        + ("; ours computes the dense vectors only" if result.get("dense_only") else ""),
    ]
    for library, rates in result.get("matmul_peak_gflops", {}).items():
        lines.append(f"matmul peak {library}: " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in rates.items()))
    header = (
        f"{'engine':<16}{'precision':<18}{'compute':<10}{'tok/s':>8}{'texts/s':>9}{'tok/cpu-s':>10}{'GFLOP/s':>9}"
        f"{'%peak':>7}{'resident MB':>12}{'peak RSS MB':>12}{'cos vs ours fp32':>17}"
    )
    lines += ["", header, "-" * len(header)]
    notes: list[str] = []
    for r in result["engines"]:
        if "error" in r:
            lines.append(f"{r['engine']:<16}{r['precision']:<18}  failed: {r['error']}")
            continue
        notes += engine_notes(r)
        lines.append(
            f"{r['engine']:<16}{r['precision']:<18}{r['compute_dtype']:<10}{r['tokens_per_s']:>8.1f}{r['texts_per_s']:>9.2f}"
            f"{_f(r['tokens_per_cpu_s']):>10}{r['gflops_per_s']:>9.1f}"
            f"{_f(r['peak_fraction'] and 100 * r['peak_fraction']):>7}{r['model_resident_mb']:>12.0f}"
            f"{r['peak_rss_mb']:>12.0f}{_f(r.get('dense_cosine_vs_keras_fp32'), '{:.6f}'):>17}"
        )
    lines += [f"note: {n}" for n in notes]
    if result.get("keras_backends"):
        lines += ["", *_backend_lines(result["keras_backends"])]
    if result.get("ratios"):
        lines += [
            "",
            "ratios (throughput ours / theirs; cpu_time: per CPU-second, robust to a busy machine):",
        ]
        lines += [f"  {k}: {v:.2f}x" for k, v in result["ratios"].items()]
    for key, label, describe in _SIDE_STEPS:
        step = result.get(key)
        if step:
            lines.append(f"{label}: failed: {step['error']}" if "error" in step else "\n" + describe(step))
    lines.append(
        f"\nfp32 weights: {result['fp32_weights_mb']:.0f} MB; "
        "resident = RSS after load and warm-up - RSS before (interpreter, TensorFlow / torch + transformers "
        "excluded; memory-mapped weights count once touched)"
    )
    return "\n".join(lines)
