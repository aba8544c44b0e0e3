"""precision="int8" on CPU: int8 weights per output channel, activations quantized on the fly.

The float32 Keras model (its weights mapped from the converted cache, checkpoint/converted.py) is converted
once to a TFLite flatbuffer with dynamic-range quantization, the same conversion as `bgem3 export --format
tflite --quantize int8`: every Dense kernel becomes int8 with one scale per output channel, and at run time
XNNPACK quantizes each batch's activations per row and runs int8 GEMMs. The flatbuffer is cached beside
the converted weights, named by the checkpoint's fingerprint, so later processes only map it.

Why TFLite and not Keras' own `model.quantize("int8")`: measured on a 2-core AMD EPYC (AVX2), one
1024 -> 4096 Dense on 2048 tokens took 0.64 s with Keras int8 (TensorFlow's int8 MatMul is not a fast
kernel) against 0.42 s in float32, while TFLite + XNNPACK ran the dynamic-range int8 layer in 0.17 s.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bgem3_embeddings.checkpoint import converted
from bgem3_embeddings.checkpoint.files import CheckpointFiles

if TYPE_CHECKING:
    from bgem3_embeddings.backends.portable.sub_batches import BatchSplitter

logger = logging.getLogger(__name__)

INT8 = "int8"


def int8_model_file(cache_dir: Path, files: CheckpointFiles) -> Path:
    """<cache>/<checkpoint key>-int8-<fingerprint hash>.tflite: a changed checkpoint gets a new name."""
    stem = converted.cache_file(cache_dir, files, INT8).name.removesuffix(".safetensors")
    stamp = hashlib.sha256(converted.fingerprint(files, INT8).encode()).hexdigest()[:12]
    return cache_dir / f"{stem}-{stamp}.tflite"


def convert_to_int8(model: Any) -> bytes:
    """The TFLite flatbuffer (int8 dynamic-range weights, builtin ops only) of a float32 BGEM3Model."""
    from bgem3_embeddings.export.serving import save_serving_module
    from bgem3_embeddings.export.tflite import convert_saved_model

    with tempfile.TemporaryDirectory(prefix="bgem3-int8-") as tmp:
        save_serving_module(model, tmp)
        return convert_saved_model(tmp, "int8")


def ensure_int8_model(
    files: CheckpointFiles,
    build_float32: Callable[[], Any],
    cache_dir: Path | None,
) -> Path:
    """Path of the int8 flatbuffer for this checkpoint, converting (minutes at full size) when missing.

    `build_float32` returns the float32 BGEM3Model; it is called only when a conversion is needed and the
    model is released afterwards. Without a cache folder the flatbuffer goes to a temporary folder.
    """
    if cache_dir is None:
        cache_dir = Path(tempfile.mkdtemp(prefix="bgem3-int8-"))
        logger.warning("int8 without a weights cache: converting into %s (done again next time)", cache_dir)
    path = int8_model_file(cache_dir, files)
    if path.is_file():
        return path
    logger.warning("converting the model to int8 (once per checkpoint; minutes at full size): %s", path)
    model = build_float32()
    flatbuffer = convert_to_int8(model)
    del model
    gc.collect()
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=cache_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(flatbuffer)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # Flatbuffers of earlier versions of this checkpoint are stale now.
    prefix = path.name.rsplit("-", 1)[0] + "-"
    for old in cache_dir.glob(prefix + "*.tflite"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


# Padded tokens per interpreter call. TFLite keeps an arena sized for the largest call it has run, and
# attention holds (rows, 16, seq, seq) float32 tensors in it, so a whole (8, 992) batch left ~0.9 GB of
# arena behind. Calls of about 1024 tokens were also the fastest on a 2-core Xeon (AVX-512 VNNI):
# (8, 992) as 8 one-row calls 5.9 s vs 7.3 s whole, (16, 512) as 2-row calls 4.5 s vs 6.2 s, (8, 256) the
# same either way (docs/precision-and-devices.md#int8-cpu).
TOKENS_PER_CALL = 1024
# Above this length one row's attention scores dominate memory: the int8 graph has plain attention (the
# float precisions chunk it), and one 8192-token row peaked at 6.2 GB of process memory (2.8 GB in fp32).
LONG_ROW_WARNING_TOKENS = 2048


def rows_per_call(seq_len: int, tokens_per_call: int = TOKENS_PER_CALL) -> int:
    """How many rows of a (batch, seq_len) batch go into one interpreter call (at least one).

    >>> rows_per_call(992), rows_per_call(256), rows_per_call(16)
    (1, 4, 64)
    """
    return max(1, tokens_per_call // max(seq_len, 1))


class Int8Runner:
    """Runs the int8 flatbuffer: (input_ids, attention_mask) -> the requested outputs as numpy arrays.

    Rows are independent in BGE-M3 (attention never crosses rows), so a batch runs as groups of rows of
    about `tokens_per_call` padded tokens and the outputs are concatenated along the batch axis.
    """

    def __init__(
        self,
        path: Path,
        num_threads: int | None = None,
        tokens_per_call: int = TOKENS_PER_CALL,
        splitter: BatchSplitter | None = None,
    ) -> None:
        from bgem3_embeddings.export.tflite import TFLiteBGEM3

        if tokens_per_call < 1:
            raise ValueError(f"tokens_per_call must be >= 1, got {tokens_per_call}")
        threads = num_threads
        if threads is None and hasattr(os, "sched_getaffinity"):
            threads = len(os.sched_getaffinity(0))  # TFLite's default is a single thread
        self.path = path
        self.tokens_per_call = tokens_per_call
        # A batch of mixed lengths as length-sorted groups, each at its own length, where that costs less
        # than its padding (backends/portable/sub_batches.py), as the float runners do on the CPU; None: as
        # given.
        self.splitter = splitter
        self.model = TFLiteBGEM3(path, num_threads=threads)
        self.warned_long_rows = False

    def __call__(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        if self.splitter is None:
            return self._run_padded(input_ids, attention_mask, outputs)
        return self.splitter.run(
            lambda ids, mask: self._run_padded(ids, mask, outputs), input_ids, attention_mask
        )

    def _run_padded(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]
    ) -> dict[str, np.ndarray]:
        seq_len = input_ids.shape[1]
        if seq_len > LONG_ROW_WARNING_TOKENS and not self.warned_long_rows:
            self.warned_long_rows = True  # once per encoder: a corpus of long passages would repeat it
            logger.warning(
                "int8 runs plain attention: a %d-token text needs about %.1f GB for its attention scores; "
                "for long passages use precision float32 or bfloat16 (chunked attention) or a smaller "
                "passage_max_length",
                seq_len,
                16 * seq_len * seq_len * 4 / 1e9,
            )
        rows = rows_per_call(seq_len, self.tokens_per_call)
        parts = [
            self.model(input_ids[start : start + rows], attention_mask[start : start + rows])
            for start in range(0, input_ids.shape[0], rows)
        ]
        if len(parts) == 1:
            return {name: parts[0][name] for name in outputs}
        return {name: np.concatenate([part[name] for part in parts], axis=0) for name in outputs}
