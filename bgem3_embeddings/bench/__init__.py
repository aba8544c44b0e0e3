"""`bgem3 bench`: throughput, memory and precision figures for this package against the PyTorch reference.

Modules: corpus (seeded multilingual texts and shared token batches), peak (matmul FLOP rate), worker (one
engine in its own process, so peak RSS is that engine's own), run (the orchestration and report),
quality (bf16 / fp16 against fp32).
"""
