"""Start-up of a fresh process, cold and warm page cache: import, construction, first and second vector.

    python benchmarks/startup.py CHECKPOINT_DIR --runs 2            # warm page cache
    python benchmarks/startup.py CHECKPOINT_DIR --runs 2 --cold     # drops the page cache first (root)

Each run is the bench's own start-up worker (`bgem3 bench` prints one warm run of it) in a new interpreter:
import of the encoder module (TensorFlow with it), `BGEM3Encoder(checkpoint)`, one short query with all
three outputs, a second query. `--cold` writes 3 to /proc/sys/vm/drop_caches before every run, so the
Python packages, TensorFlow's libraries, the checkpoint and the converted-weights cache are all read from
disk again; it needs root (Linux). Set BGEM3_WEIGHTS_CACHE as the runs should see it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
STEPS = ("import_s", "construct_s", "first_vector_s", "second_vector_s")


class StartupError(RuntimeError):
    """The runs cannot be made as asked (the message says why)."""


def drop_page_cache(path: Path = DROP_CACHES) -> None:
    """Write dirty pages back, then drop the clean page cache, dentries and inodes (needs root)."""
    os.sync()
    try:
        path.write_text("3\n")
    except OSError as error:
        reason = f"{path}: {error.strerror}"
        raise StartupError(f"cannot drop the page cache ({reason}); --cold needs root on Linux") from None


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before every run")
    args = parser.parse_args(argv)

    from bgem3_embeddings.bench.run import run_worker

    results = []
    with tempfile.TemporaryDirectory(prefix="bgem3-startup-") as tmp:
        for index in range(args.runs):
            if args.cold:
                drop_page_cache()
            spec = {"engine": "keras-startup", "precision": args.precision, "model": str(args.checkpoint)}
            result = run_worker(spec, Path(tmp))
            if "error" in result:
                raise StartupError(f"run {index + 1}: {result['error']}")
            results.append({step: result[step] for step in STEPS})
            print(f"{'cold' if args.cold else 'warm'} run {index + 1}: " + ", ".join(
                f"{step.removesuffix('_s').replace('_', ' ')} {result[step]:.2f} s" for step in STEPS))
    return results


if __name__ == "__main__":
    try:
        main()
    except StartupError as error:
        print(f"startup: {error}", file=sys.stderr)
        sys.exit(2)
