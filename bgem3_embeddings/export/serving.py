"""The exported signature: a tf.Module that owns the model's variables and one `serving_default` function.

    serving_default(input_ids: int32 [None, None], attention_mask: int32 [None, None])
        -> {"dense_vecs": f32 [b, H], "sparse_weights": f32 [b, s], "colbert_vecs": f32 [b, s - 1, C]}
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from bgem3_embeddings.model import OUTPUT_NAMES, BGEM3Model, _l2_normalize

SIGNATURE_NAME = "serving_default"
INPUT_SIGNATURE = (
    tf.TensorSpec([None, None], tf.int32, name="input_ids"),
    tf.TensorSpec([None, None], tf.int32, name="attention_mask"),
)


def builtin_ops_outputs(model: BGEM3Model, input_ids: Any, attention_mask: Any) -> dict[str, Any]:
    """The same outputs as model.call, written so that TFLite converts every op to a builtin.

    BGEM3Model.heads masks colbert vectors with `mask[:, 1:, None]`: a strided slice with a new axis on a
    dynamic shape, which TFLite can only run as a Flex (SELECT_TF_OPS) op. expand_dims is a builtin and
    gives the same values; the export tests compare these outputs with the Keras model's.
    """
    hidden = model.encode_hidden(input_ids, attention_mask)
    result = model.heads(hidden, input_ids, attention_mask, outputs=("dense_vecs", "sparse_weights"))
    mask = tf.cast(attention_mask, tf.float32)
    colbert = tf.cast(model.colbert_linear(hidden[:, 1:]), tf.float32) * tf.expand_dims(mask[:, 1:], -1)
    result["colbert_vecs"] = _l2_normalize(colbert)
    return result


class ServingModule(tf.Module):
    """Holds the Keras model's variables (so tf.saved_model.save writes them) and the serving function."""

    def __init__(self, model: BGEM3Model, *, builtin_ops_only: bool = False) -> None:
        super().__init__(name="bgem3")
        # Tracked by tf.Module: these are the variables the SavedModel stores; nothing else of Keras is kept.
        # The underlying tf.Variables, not the Keras wrappers: with the wrappers the TFLite converter keeps
        # them as uninitialised resource variables (a weightless model that outputs NaN) instead of constants.
        self.model_variables = [v.value for v in model.variables]
        # Plain attention: chunked (map_fn) attention only pays off for very long inputs.
        model.set_query_chunk_size(None)

        def serve(input_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
            if builtin_ops_only:
                out = builtin_ops_outputs(model, input_ids, attention_mask)
            else:
                out = model({"input_ids": input_ids, "attention_mask": attention_mask}, outputs=OUTPUT_NAMES)
            # Fixed output names and dtype whatever the compute precision.
            return {name: tf.cast(out[name], tf.float32, name=name) for name in OUTPUT_NAMES}

        self.serve = tf.function(serve, input_signature=INPUT_SIGNATURE, autograph=False)


def save_serving_module(model: BGEM3Model, path: str, *, builtin_ops_only: bool = False) -> None:
    """tf.saved_model.save a ServingModule for `model` into `path` with the serving_default signature."""
    module = ServingModule(model, builtin_ops_only=builtin_ops_only)
    tf.saved_model.save(module, path, signatures={SIGNATURE_NAME: module.serve.get_concrete_function()})
