"""Does the model itself keep native memory when batch shapes keep changing? (docs/design/serve-memory.md)

Encodes CALLS batches of random shapes (1-16 rows, 3-400 tokens, all three outputs) in this one process,
calls glibc's `malloc_trim(0)` every 200 calls (as the server's batcher does every 10 s) and prints the
process's VmRSS and glibc's bytes in use and free (`mallinfo2`) after each trim, then the least-squares
slopes after the first 2,000 calls (`--settled-after`). Linux with glibc only.

    python benchmarks/findings/native_memory_shapes.py --model /path/to/checkpoint --calls 15000
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import numpy as np

OUTPUTS = ("dense_vecs", "sparse_weights", "colbert_vecs")
TRIM_EVERY_CALLS = 200


class MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (all fields size_t)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost",
        )
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="hub id or local checkpoint directory")
    parser.add_argument("--calls", type=int, default=15000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settled-after", type=int, default=2000, help="calls before the slopes are fitted")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        parser.error("needs Linux with glibc (malloc_trim, mallinfo2, /proc/self/status)")
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2

    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.serve.soak import rss_mb  # the soak's own VmRSS reader

    encoder = BGEM3Encoder(args.model)
    encoder.eager_batches_left = 0  # every call through the traced function, as a warm server runs
    vocab = encoder.config.vocab_size
    rng = np.random.default_rng(args.seed)
    rows: list[tuple[int, float, float, float]] = []
    print(f"{'calls':>7} {'VmRSS MB':>9} {'in use MB':>10} {'free MB':>8}")
    for call in range(1, args.calls + 1):
        shape = (int(rng.integers(1, 17)), int(rng.integers(3, 401)))
        ids = rng.integers(5, vocab, size=shape).astype(np.int32)
        ids[:, 0], ids[:, -1] = encoder.config.bos_token_id, encoder.config.eos_token_id
        encoder.run_batch(ids, np.ones_like(ids), OUTPUTS)
        if call % TRIM_EVERY_CALLS == 0:
            libc.malloc_trim(0)
            info = libc.mallinfo2()
            in_use = (info.uordblks + info.hblkhd) / 2**20
            rows.append((call, rss_mb(os.getpid())[0], in_use, info.fordblks / 2**20))
            print(f"{call:>7} {rows[-1][1]:>9.1f} {in_use:>10.1f} {rows[-1][3]:>8.1f}", flush=True)
    settled = np.array([r for r in rows if r[0] >= args.settled_after])
    if len(settled) >= 3:
        per_10k = [np.polyfit(settled[:, 0], settled[:, k], 1)[0] * 10_000 for k in (1, 2)]
        rss, in_use = settled[:, 1], settled[:, 2]
        print(
            f"after {args.settled_after} calls: VmRSS {rss.min():.1f}-{rss.max():.1f} MB, slope "
            f"{per_10k[0]:+.2f} MB per 10,000 calls; in use {in_use.min():.1f}-{in_use.max():.1f} MB, slope "
            f"{per_10k[1]:+.2f} MB per 10,000 calls"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
