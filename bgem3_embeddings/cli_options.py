"""Options that mean the same thing in every command of `bgem3` and `bgem3-qdrant`, defined once.

Both CLIs import these aliases, so `--device` and `--precision` read the same everywhere they choose where
and at which dtype a model runs (tests/test_cli_vocabulary.py holds every command to it). The values are
what `devices.choose_device` and `devices.choose_precision` accept.
"""

from __future__ import annotations

from typing import Annotated

import typer

DEVICE_HELP = "auto (a GPU when one is seen, else the CPU) | cpu | gpu | cuda | metal | /GPU:N"
# int8 is TFLite's (bgem3_embeddings/backends/tensorflow/int8.py): the CPU only, on Keras' TensorFlow backend.
PRECISION_HELP = "auto | float32 | bfloat16 | float16 | int8 (CPU, TensorFlow); docs/precision-and-devices.md"

DeviceOpt = Annotated[str, typer.Option("--device", help=DEVICE_HELP)]
PrecisionOpt = Annotated[str, typer.Option("--precision", help=PRECISION_HELP)]
