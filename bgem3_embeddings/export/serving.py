"""The exported signature: a tf.Module that owns the model's variables and one `serving_default` function.

    serving_default(input_ids: int32 [None, None], attention_mask: int32 [None, None])
        -> {"dense_vecs": f32 [b, H], "sparse_weights": f32 [b, s], "colbert_vecs": f32 [b, s - 1, C]}

Inputs may be padded on the right or the left (pad id 1, mask 0). dense_vecs is the state of each row's
<s>; sparse_weights is aligned with input_ids; colbert_vecs holds the real tokens after <s> first (a row
with n real tokens: colbert_vecs[:n - 1]), then zeros, on either padding side.

Another model on the backbone (the cross-encoder, BGEM3RerankerModel) exports its own outputs, the keys of
its OUTPUT_LAYOUT: {"scores": f32 [b]} (int8.py converts it so).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from bgem3_embeddings.model import BGEM3Model

SIGNATURE_NAME = "serving_default"
INPUT_SIGNATURE = (
    tf.TensorSpec([None, None], tf.int32, name="input_ids"),
    tf.TensorSpec([None, None], tf.int32, name="attention_mask"),
)


class ServingModule(tf.Module):
    """Holds the Keras model's variables (so tf.saved_model.save writes them) and the serving function."""

    def __init__(self, model: BGEM3Model | Any) -> None:
        super().__init__(name="bgem3")
        names = tuple(model.OUTPUT_LAYOUT)  # BGE-M3's three outputs, or another model's own
        # Tracked by tf.Module: these are the variables the SavedModel stores; nothing else of Keras is kept.
        # The underlying tf.Variables, not the Keras wrappers: with the wrappers the TFLite converter keeps
        # them as uninitialised resource variables (a weightless model that outputs NaN) instead of constants.
        self.model_variables = [v.value for v in model.variables]
        # Plain attention: chunked (map_fn) attention only pays off for very long inputs.
        model.set_query_chunk_size(None)

        def serve(input_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
            # The model's own heads: built from ops TFLite runs as builtins, so both formats share them.
            # Tables read, then gathered: a loaded SavedModel restores each variable whole (nothing to copy
            # on read), and GatherV2 has a kernel on every GPU backend where ResourceGather has none on the
            # Apple GPU (docs/precision-and-devices.md). Runs while tracing only.
            gather_mode = model.embeddings.gather_from_variables
            model.embeddings.gather_from_variables = False
            try:
                out = model({"input_ids": input_ids, "attention_mask": attention_mask}, outputs=names)
            finally:
                model.embeddings.gather_from_variables = gather_mode
            # Fixed output names and dtype whatever the compute precision.
            return {name: tf.cast(out[name], tf.float32, name=name) for name in names}

        self.serve = tf.function(serve, input_signature=INPUT_SIGNATURE, autograph=False)


def save_serving_module(model: BGEM3Model | Any, path: str) -> None:
    """tf.saved_model.save a ServingModule for `model` into `path` with the serving_default signature."""
    module = ServingModule(model)
    tf.saved_model.save(module, path, signatures={SIGNATURE_NAME: module.serve.get_concrete_function()})
