"""BGEM3RerankerModel: the XLM-RoBERTa encoder plus the sequence-classification head of bge-reranker-v2-m3.

transformers' XLMRobertaForSequenceClassification with one label: the last hidden state of <s> goes through
classifier.dense (H -> H), tanh, and classifier.out_proj (H -> 1); that one logit is the pair's score
(FlagReranker's `logits[:, 0]`). Built from Keras Dense layers and keras.ops only, so it runs on
TensorFlow, JAX and PyTorch like the encoder it extends.

    >>> model = BGEM3RerankerModel(BGEM3Config(vocab_size=100, hidden_size=8, num_hidden_layers=1,
    ...                                        num_attention_heads=2, intermediate_size=16))
    >>> model({"input_ids": ids, "attention_mask": mask})["scores"]   # (b,) float32 logits  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
from keras import ops

from bgem3_embeddings.config import BGEM3Config
from bgem3_embeddings.model import XLMRobertaEncoderModel, _gather_rows, first_real_token

SCORES = "scores"
RERANKER_OUTPUTS = (SCORES,)


class BGEM3RerankerModel(XLMRobertaEncoderModel):
    """XLM-RoBERTa encoder + classification head: one float32 logit per (query, passage) pair.

    Inputs: input_ids, attention_mask, int32 (b, s), `<s> query </s></s> passage </s>` right- or
    left-padded with pad_token_id. Output: {"scores": (b,) float32}.
    """

    # How each output is laid out (read by the runners): one value per row.
    OUTPUT_LAYOUT = {SCORES: "row"}

    def __init__(
        self,
        config: BGEM3Config,
        *,
        initializer: str = "zeros",
        dtype: Any = None,
        compute_dtype: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, initializer=initializer, dtype=dtype, compute_dtype=compute_dtype, **kwargs)
        H = config.hidden_size
        self.classifier_dense = keras.layers.Dense(
            H, kernel_initializer=initializer, name="classifier_dense", dtype=self.dense_policy
        )
        self.classifier_out_proj = keras.layers.Dense(
            1, kernel_initializer=initializer, name="classifier_out_proj", dtype=self.dense_policy
        )
        self.build_all()

    def build_all(self) -> None:
        """Create every variable now (so weights can be ported before the first call)."""
        self.build_encoder()
        self.classifier_dense.build((None, self.config.hidden_size))
        self.classifier_out_proj.build((None, self.config.hidden_size))
        self.built = True

    def heads(
        self,
        hidden: Any,
        input_ids: Any,
        attention_mask: Any,
        outputs: Sequence[str] = RERANKER_OUTPUTS,
        drop: Callable[[Any], Any] | None = None,
    ) -> dict:
        """The classification head on each row's <s> state (the first real token, whatever the padding
        side): {"scores": (b,) float32 logits}. `drop` (training only) is dropout where transformers'
        XLMRobertaClassificationHead has it: on the <s> state and after the tanh."""
        unknown = [name for name in outputs if name not in RERANKER_OUTPUTS]
        if unknown:
            raise ValueError(f"unknown reranker output(s) {unknown}: it gives {list(RERANKER_OUTPUTS)}")
        if SCORES not in outputs:
            return {}
        first = first_real_token(ops.cast(attention_mask, "float32"))  # 0 for right padding, pads for left
        cls = _gather_rows(hidden, first)  # (b, H)
        if drop is not None:
            cls = drop(cls)
        # tanh in float32 (the residual stream's dtype); each Dense casts its input to its compute dtype.
        x = ops.tanh(ops.cast(self.classifier_dense(cls), "float32"))
        if drop is not None:
            x = drop(x)
        logits = ops.cast(self.classifier_out_proj(x), "float32")  # (b, 1)
        return {SCORES: logits[:, 0]}

    def call(self, inputs: dict, outputs: Sequence[str] = RERANKER_OUTPUTS) -> dict:
        input_ids = ops.cast(inputs["input_ids"], "int32")
        attention_mask = ops.cast(inputs["attention_mask"], "int32")
        hidden = self.encode_hidden(input_ids, attention_mask)
        return self.heads(hidden, input_ids, attention_mask, outputs)
