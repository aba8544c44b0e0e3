"""Where a short query's time goes between the socket and the model, with 16 clients
(docs/design/serve-batching.md).

In one run: 64 short queries (8-16 tokens, all three outputs) encoded in this process one per call and all
in one call; then a `bgem3 serve` process answers them from 1 client and, `--passes` times, from 16 clients
(each pass sends every query twice). During the last 16-client pass py-spy samples the server's threads
(`--pyspy`, 100 Hz, idle included, raw collapsed stacks); each pass prints the server's and the clients' CPU
seconds (the clients are threads of this process), and the server's /metrics (batch sizes) are saved.

    python benchmarks/serve_query_profile.py --model /tmp/bgem3-full --pyspy /tmp/pyspy.txt
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

ALL = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--pyspy", type=Path, help="write py-spy's raw samples of the last pass here")
    parser.add_argument("--metrics", type=Path, help="write the server's /metrics here at the end")
    args = parser.parse_args()

    import httpx

    from bgem3_embeddings.cli_support import start_tensorflow_quietly
    from bgem3_embeddings.serve import bench
    from bgem3_embeddings.serve.soak import load_average

    start_tensorflow_quietly()
    from bgem3_embeddings.encoder import BGEM3Encoder

    encoder = BGEM3Encoder(args.model, precision="float32", show_progress=False)
    texts = bench.make_texts(encoder.tokenizer, 64, bench.QUERY_TOKENS, seed=1)
    rows = bench.in_process(encoder, texts, "queries", ALL)
    length = encoder.query_max_length
    del encoder
    pyspy = shutil.which("py-spy")
    with bench.server_process(args.model, "float32", []) as (proc, url):
        bench.through_server(url, texts[:16], "queries", 4, ALL, length)  # warm-up
        rows.append(bench.through_server(url, texts, "queries", 1, ALL, length))
        for n in range(args.passes):
            sampler = None
            if args.pyspy is not None and pyspy is not None and n == args.passes - 1:
                command = [pyspy, "record", "-p", str(proc.pid), "-r", "100", "--threads", "--idle"]
                command += ["--nonblocking", "--format", "raw", "-o", str(args.pyspy)]
                sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(2)
            server0, clients0 = cpu_seconds(proc.pid), time.process_time()
            row = bench.through_server(url, texts * 2, "queries", 16, ALL, length)
            server1, clients1 = cpu_seconds(proc.pid), time.process_time()
            if sampler is not None:
                sampler.send_signal(signal.SIGINT)
                sampler.wait(60)
            row.texts, row.tokens, row.seconds = row.texts // 2, row.tokens // 2, row.seconds / 2
            rows.append(row)
            print(
                f"16-client pass {n}: {2 * len(texts)} requests in {2 * row.seconds:.1f} s; server CPU "
                f"{server1 - server0:.1f} s, clients' CPU {clients1 - clients0:.1f} s",
                flush=True,
            )
        if args.metrics is not None:
            args.metrics.write_text(httpx.get(url + "/metrics").text)
    header = f"{args.model}; CPU {bench.cpu_model()}, {os.cpu_count()} cores; load average {load_average()}"
    print(bench.format_report(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
