"""A whole forward pass on JAX's CPU backend: wall time, user and system CPU time and minor page faults, for
the 24 layers as one compiled program (the JAX runner), as one compiled layer called 24 times (how the
runner ran before, here with today's boolean attention mask), and KerasHub's XLMRobertaBackbone (one
program, `predict_on_batch`).

    python benchmarks/findings/jax_page_faults.py --model /tmp/full-bge-m3 --batch 4 --length 768 --calls 2

Each engine runs in its own process (KERAS_BACKEND=jax): load, one warm-up call (the compile), then
`--calls` timed calls of the same (batch, length) ids, dense output only. A minor page fault is a fresh page
the process touched; XLA:CPU allocates a program's temporary buffers at each call, so a program called 24
times pays them 24 times. Needs keras-hub (`pip install --no-deps keras-hub==0.32.0`) for the third row.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ENGINES = ("one program", "24 layer calls", "kerashub")


def _forward(engine: str, model: str, ids: Any, mask: Any) -> Callable[[], Any]:
    """A function running one forward pass of `engine` on the ids, after loading the model."""
    import jax

    if engine == "kerashub":
        from bgem3_embeddings.bench.kerashub import load_kerashub_embedder

        hub = load_kerashub_embedder(model, tempfile.mkdtemp(), dtype="float32")
        return lambda: hub.predict_on_batch({"token_ids": ids, "padding_mask": mask})
    from bgem3_embeddings import BGEM3Encoder

    encoder = BGEM3Encoder(model, precision="float32", device="cpu")
    if engine == "one program":
        return lambda: encoder.run_batch(ids, mask, ("dense_vecs",))["dense_vecs"]
    from bgem3_embeddings.backends.portable.kernels import block_forward

    runner, config = encoder.runner, encoder.model.config
    layer = jax.jit(
        lambda w, x, bias: block_forward(
            x, bias, w, num_heads=config.num_attention_heads, epsilon=config.layer_norm_eps, chunk=None
        )
    )
    weights = [[v.value for v in layer_.weight_variables()] for layer_ in encoder.model.encoder_layers]
    ids_j, mask_j = jax.numpy.asarray(ids), jax.numpy.asarray(mask)

    def per_layer() -> Any:
        x = runner._embed([v.value for v in runner.embedding_variables], ids_j)
        bias = runner._mask_bias(mask_j)
        for w in weights:
            x = layer(w, x, bias)
        return x[:, 0]

    return per_layer


def measure(engine: str, model: str, batch: int, length: int, calls: int) -> list[dict]:
    """Per timed call: wall s, user s, system s, minor page faults."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(5, 1000, size=(batch, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 0, 2
    mask = np.ones_like(ids)
    forward = _forward(engine, model, ids, mask)
    jax.block_until_ready(forward())
    rows = []
    for _ in range(calls):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        jax.block_until_ready(forward())
        after = resource.getrusage(resource.RUSAGE_SELF)
        rows.append(
            {
                "wall_s": time.perf_counter() - start,
                "user_s": after.ru_utime - before.ru_utime,
                "system_s": after.ru_stime - before.ru_stime,
                "minor_faults": after.ru_minflt - before.ru_minflt,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local full-size checkpoint folder")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=768)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)  # the child process's part
    args = parser.parse_args()
    if args.engine:
        rows = measure(args.engine, args.model, args.batch, args.length, args.calls)
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3"}
    print(f"{args.batch} x {args.length} tokens, {args.calls} timed calls each (after one warm-up call)")
    print(f"{'engine':<16} {'wall s':>7} {'user s':>7} {'system s':>9} {'minor faults':>13}")
    for engine in ENGINES:
        child = subprocess.run(
            [sys.executable, __file__, "--engine", engine, "--model", args.model, "--batch", str(args.batch),
             "--length", str(args.length), "--calls", str(args.calls)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if child.returncode != 0:
            raise SystemExit(f"{engine} failed:\n{child.stderr[-2000:]}")
        for row in json.loads(child.stdout.strip().splitlines()[-1]):
            print(
                f"{engine:<16} {row['wall_s']:7.2f} {row['user_s']:7.1f} {row['system_s']:9.1f} "
                f"{row['minor_faults']:13,}"
            )


if __name__ == "__main__":
    main()
