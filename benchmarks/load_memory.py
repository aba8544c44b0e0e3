"""Peak RSS of loading a checkpoint, against the size of its weights.

    python benchmarks/load_memory.py CHECKPOINT_DIR [--precision float32]

Prints the process's RSS after importing TensorFlow (the baseline), its peak while loading (VmHWM) and
after loading, each as a ratio of the encoder weights' size. Run it in a fresh process: the figures are
for the whole process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def rss_fields() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process in bytes, from /proc (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--precision", default="float32")
    args = parser.parse_args(argv)

    import tensorflow as tf  # noqa: F401  (the baseline includes the TensorFlow runtime)

    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.checkpoint.open_weights import open_tensor_source

    files = checkpoint_files_in(args.checkpoint)
    with open_tensor_source(files.weights) as source:
        weights_bytes = sum(
            int(i.dtype.itemsize) * int(__import__("math").prod(i.shape)) for i in source.infos().values()
        )
    baseline = rss_fields()["VmRSS"]
    encoder = BGEM3Encoder(args.checkpoint, precision=args.precision, device="cpu")
    after = rss_fields()
    gib = 1024**3
    result = {
        "weights_gib": weights_bytes / gib,
        "baseline_rss_gib": baseline / gib,
        "peak_rss_gib": after["VmHWM"] / gib,
        "rss_after_load_gib": after["VmRSS"] / gib,
        "peak_over_weights": after["VmHWM"] / weights_bytes,
        "peak_minus_baseline_over_weights": (after["VmHWM"] - baseline) / weights_bytes,
        "resident_model_over_weights": (after["VmRSS"] - baseline) / weights_bytes,
    }
    del encoder
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return result


if __name__ == "__main__":
    main()
