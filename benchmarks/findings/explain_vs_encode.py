"""What `explain(query, passage)` costs beside one `encode` of the same pair (issue target: at most 1.2x).

Both run the same model call (the query and the passage in one batch, all three outputs); explain adds the
tokenization with character spans and the decomposition (numpy). Runs alternate, so drifting load on a
shared machine hits both alike; the ratio of medians is printed.

    python benchmarks/findings/explain_vs_encode.py --model /path/to/checkpoint --passage-tokens 512 --runs 7
    python benchmarks/findings/explain_vs_encode.py --make-checkpoint full --out /tmp/full-random  # torch
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

QUERY = "What is BGE M3 and how does it weigh dense, sparse and multi-vector scores?"
SENTENCE = (
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector "
    "interaction, in more than a hundred languages and for inputs of up to 8192 tokens. "
)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def passage_of(encoder: object, tokens: int) -> str:
    """A passage of exactly `tokens` tokens with <s> and </s> (cut at a token boundary)."""
    text = SENTENCE * (tokens // 8 + 8)
    spans = encoder.tokenizer.token_spans([text], tokens)[0]  # type: ignore[attr-defined]
    return text[: max(t.stop for t in spans)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder or hub id")
    parser.add_argument("--make-checkpoint", choices=["tiny", "full"], help="generate a random one first")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bgem3-explain-bench"))
    parser.add_argument("--passage-tokens", type=int, default=512)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    model = args.model
    if args.make_checkpoint:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.tiny_checkpoint import make_tiny_checkpoint

        if not (args.out / "config.json").exists():
            make_tiny_checkpoint(args.out, size=args.make_checkpoint)
        model = str(args.out)
    if model is None:
        parser.error("give --model or --make-checkpoint")

    from bgem3_embeddings import BGEM3Encoder

    encoder = BGEM3Encoder(model, precision="float32", device="cpu", show_progress=False, eager_batches=0)
    passage = passage_of(encoder, args.passage_tokens)
    outputs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    encoder.encode([QUERY, passage], **outputs)  # trace both paths once before timing
    encoder.explain(QUERY, passage)
    encode_s: list[float] = []
    explain_s: list[float] = []
    for _ in range(args.runs):
        start = time.perf_counter()
        encoder.encode([QUERY, passage], **outputs)
        encode_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        encoder.explain(QUERY, passage)
        explain_s.append(time.perf_counter() - start)
    enc, exp = statistics.median(encode_s), statistics.median(explain_s)
    n_q = len(encoder.tokenize([QUERY], 512)[0])
    layers = encoder.config.num_hidden_layers
    print(f"cpu: {cpu_model()}; model: {model} (hidden {encoder.hidden_size}, {layers} layers); "
          f"query {n_q} tokens, passage {args.passage_tokens} tokens")
    print(f"encode  [query, passage], all outputs: median {enc * 1000:9.2f} ms over {args.runs} runs")
    print(f"explain (query, passage):              median {exp * 1000:9.2f} ms over {args.runs} runs")
    print(f"explain / encode: {exp / enc:.3f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
