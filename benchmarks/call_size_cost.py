"""What one encoder call costs by its number of texts: the fixed part of a call and the part per text.

Rows of `--length` tokens (all three outputs, the model's `run_batch`, no tokenization), `--sizes` texts per
call, each size timed over about `--texts` texts per round, `--rounds` rounds with the sizes in turn (the
machine's other load falls on all alike). Prints per size the median ms per call and per text and the
per-text cost against the largest size, then a least-squares line ms per call = fixed + per text x texts:
the fixed part is what a server pays again for every call, so what small calls lose against large ones.

    python benchmarks/call_size_cost.py --model /tmp/bgem3-full --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

OUTPUTS = ("dense_vecs", "sparse_weights", "colbert_vecs")


def line_fit(sizes: list[int], ms: list[float]) -> tuple[float, float]:
    """(fixed ms per call, ms per text) of the least-squares line through (size, ms).

    >>> line_fit([1, 2, 4], [12.0, 14.0, 18.0])
    (10.0, 2.0)
    """
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(ms, float), 1)
    return round(float(intercept), 6), round(float(slope), 6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--length", type=int, default=14, help="tokens per text, <s> and </s> included")
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--texts", type=int, default=128, help="texts per size and round (at least 2 calls)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))

    from bgem3_embeddings.cli_support import start_tensorflow_quietly
    from bgem3_embeddings.serve import bench
    from bgem3_embeddings.serve.soak import load_average

    start_tensorflow_quietly()
    from bgem3_embeddings.encoder import BGEM3Encoder

    encoder = BGEM3Encoder(args.model, precision=args.precision, show_progress=False)
    config = encoder.config
    rng = np.random.default_rng(0)

    def batch(size: int) -> tuple[np.ndarray, np.ndarray]:
        ids = rng.integers(5, config.vocab_size, (size, args.length), dtype=np.int32)
        ids[:, 0], ids[:, -1] = config.bos_token_id, config.eos_token_id
        return ids, np.ones_like(ids)

    for size in sizes:  # trace and warm every shape first
        for _ in range(2):
            encoder.run_batch(*batch(size), OUTPUTS)
    per_call: dict[int, list[float]] = {size: [] for size in sizes}
    load = [load_average()]
    for rnd in range(args.rounds):
        for size in sizes:
            calls = max(2, args.texts // size)
            batches = [batch(size) for _ in range(calls)]
            start = time.perf_counter()
            for ids, mask in batches:
                encoder.run_batch(ids, mask, OUTPUTS)
            per_call[size].append((time.perf_counter() - start) * 1000 / calls)
        load.append(load_average())
        print(f"round {rnd}: " + ", ".join(f"{s}: {per_call[s][-1]:.0f} ms" for s in sizes), flush=True)

    medians = {size: statistics.median(ms) for size, ms in per_call.items()}
    largest = sizes[-1]
    print(f"\n{args.model} ({args.precision}), {args.length} tokens a text; {bench.cpu_model()}; load {load}")
    print(f"{'texts':>6} {'ms/call':>9} {'ms/text':>9} {'vs ' + str(largest):>7}")
    for size in sizes:
        per_text = medians[size] / size
        print(f"{size:6d} {medians[size]:9.1f} {per_text:9.2f} {medians[largest] / largest / per_text:7.2f}x")
    fixed, slope = line_fit(sizes, [medians[s] for s in sizes])
    print(f"least squares: {fixed:.1f} ms per call + {slope:.2f} ms per text")
    if args.json is not None:
        report = {"cpu": bench.cpu_model(), "load": load, "length": args.length, "per_call_ms": per_call}
        args.json.write_text(json.dumps({**report, "fixed_ms": fixed, "per_text_ms": slope}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
