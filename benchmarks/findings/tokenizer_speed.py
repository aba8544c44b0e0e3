"""Tokenizer load time and encode speed: tokenizer.json as published vs BGEM3Tokenizer vs transformers.

    python benchmarks/findings/tokenizer_speed.py [CHECKPOINT_DIR] [--repeats 5]

Without CHECKPOINT_DIR it generates the tiny test checkpoint (needs torch) and pads its vocabulary to
BGE-M3's 250002 pieces, so loading costs what the real checkpoint's does. The engines run interleaved in
each repeat; best and median seconds and the ratio to the published pipeline are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from bgem3_embeddings.tokenizer import BGEM3Tokenizer

FULL_VOCAB = 250002


def bge_m3_sized_checkpoint(out: Path) -> Path:
    """The tiny checkpoint's tokenizer files with the vocabulary padded to 250002 pieces."""
    from tests.tiny_checkpoint import model_config, write_tokenizer

    write_tokenizer(out)
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    filler = [[f"▁w{i}", -20.0] for i in range(FULL_VOCAB - len(vocab))]  # rare: never chosen
    data["model"]["vocab"] = vocab[:-1] + filler + vocab[-1:]
    data["added_tokens"][-1]["id"] = FULL_VOCAB - 1
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    (out / "config.json").write_text(json.dumps(model_config(FULL_VOCAB)))
    return out


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", nargs="?", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.checkpoint or bge_m3_sized_checkpoint(Path(tmp))
        from transformers import AutoTokenizer

        from tests.tiny_checkpoint import SAMPLE_TEXT

        texts = [" ".join(SAMPLE_TEXT[i % len(SAMPLE_TEXT):] + SAMPLE_TEXT) for i in range(256)]
        path = str(root / "tokenizer.json")
        loaders: dict[str, Callable[[], Any]] = {
            "published tokenizer.json": lambda: Tokenizer.from_file(path),
            "BGEM3Tokenizer.from_dir": lambda: BGEM3Tokenizer.from_dir(root),
            "transformers AutoTokenizer": lambda: AutoTokenizer.from_pretrained(str(root)),
        }
        published = BGEM3Tokenizer(Tokenizer.from_file(path))
        ours = BGEM3Tokenizer.from_dir(root)
        encoders: dict[str, Callable[[], Any]] = {
            "published tokenizer.json": lambda: published.encode_batch(texts, 8192),
            "BGEM3Tokenizer.from_dir": lambda: ours.encode_batch(texts, 8192),
        }
        for title, engines in (("load", loaders), (f"encode {len(texts)} texts", encoders)):
            times: dict[str, list[float]] = {name: [] for name in engines}
            for _ in range(args.repeats):
                for name, fn in engines.items():
                    times[name].append(timed(fn))
            base = min(times["published tokenizer.json"])
            print(f"{title}:")
            for name, values in times.items():
                print(f"  {name:28s} best {min(values):.3f} s  median {statistics.median(values):.3f} s"
                      f"  best/published {min(values) / base:.2f}")


if __name__ == "__main__":
    main()
