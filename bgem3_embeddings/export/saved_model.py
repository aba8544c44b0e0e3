"""SavedModel export: serving_default signature, tokenizer files beside it, export_manifest.json.

Layout of OUT (a SavedModel folder; extra files are ignored by loaders and TF Serving):
    saved_model.pb, variables/, assets/, fingerprint.pb
    tokenizer/             tokenizer.json, sentencepiece.bpe.model, ... and config.json
    export_manifest.json
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from bgem3_embeddings.export.manifest import TOKENIZER_DIR, build_manifest, copy_tokenizer, write_manifest
from bgem3_embeddings.export.options import ExportError
from bgem3_embeddings.export.staging import staged_output

logger = logging.getLogger(__name__)


def export_saved_model(encoder: Any, out: str | Path, *, revision: str | None = None) -> Path:
    """Write `encoder`'s model as a SavedModel into the new folder `out`; returns `out`.

    The variables keep the encoder's precision (float32 unless it was built otherwise); outputs are
    always float32. Loading needs only TensorFlow: tf.saved_model.load(out).signatures["serving_default"].
    """
    from bgem3_embeddings.export.serving import save_serving_module

    if encoder.model is None:
        raise ExportError(f"a SavedModel needs a float encoder, got precision {encoder.precision}")
    out = Path(out).expanduser()
    with staged_output(out) as staging:
        logger.info("saving the SavedModel of %s (%s)", encoder.model_id, encoder.precision)
        save_serving_module(encoder.model, str(staging))
        tokenizer_files = copy_tokenizer(Path(encoder.files.root), staging / TOKENIZER_DIR)
        manifest = build_manifest(encoder, format="saved_model", weights=encoder.precision, model_file=".",
                                  revision=revision, tokenizer_files=tokenizer_files)
        write_manifest(staging, manifest)
    return out
