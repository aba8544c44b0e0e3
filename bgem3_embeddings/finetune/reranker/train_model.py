"""The Keras model `fit()` trains for the reranker: the cross-encoder's layers, FlagEmbedding's loss on top.

`RerankerFinetuner` wraps a loaded `BGEM3RerankerModel` (FlagEmbedding's `CrossEncoderModel` around
`AutoModelForSequenceClassification`): its call scores every pair of the batch and returns the loss and its
terms (loss.py). In training, dropout sits where transformers' XLM-RoBERTa has it: the encoder's
(finetune/dropout.py, with optional remat) and the classification head's, at `classifier_dropout` (or
`hidden_dropout_prob` when the config has none), as XLMRobertaClassificationHead applies it. After `fit()`
the wrapped model is the tuned one.

A batch is a dict of arrays (batches.pair_inputs):
    input_ids, attention_mask    (B * G, L) int32, right-padded, each group's pairs in order, positive first
    teacher_scores               (B, G) float32, only with knowledge distillation

    >>> finetuner = RerankerFinetuner(model, group_size=8)
    >>> finetuner.compile(optimizer=keras.optimizers.SGD(1e-5))
    >>> finetuner.fit(batches, epochs=1)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from keras import ops

from bgem3_embeddings.finetune.dropout import EncoderDropout
from bgem3_embeddings.finetune.reranker.loss import reranker_loss
from bgem3_embeddings.finetune.train_model import LastValue, TermsModel
from bgem3_embeddings.reranker.model import SCORES, BGEM3RerankerModel


def classifier_dropout_rate(config_json: Path) -> float:
    """transformers' head dropout: config.json's classifier_dropout, else hidden_dropout_prob (else 0.1)."""
    data = json.loads(Path(config_json).read_text(encoding="utf-8"))
    rate = data.get("classifier_dropout")
    return float(rate if rate is not None else data.get("hidden_dropout_prob", 0.1))


class RerankerFinetuner(TermsModel):
    """FlagEmbedding's `CrossEncoderModel` in training mode, on a `BGEM3RerankerModel`'s layers."""

    def __init__(
        self,
        reranker: BGEM3RerankerModel,
        *,
        group_size: int,
        knowledge_distillation: bool = False,
        dropout: EncoderDropout | None = None,
        classifier_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(name="reranker_finetuner", **kwargs)
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        if not 0.0 <= classifier_dropout < 1.0:
            raise ValueError(f"classifier_dropout must be in [0, 1), got {classifier_dropout}")
        if classifier_dropout > 0 and dropout is None:
            raise ValueError("classifier_dropout needs an EncoderDropout (its seed state draws the masks)")
        self.reranker = reranker
        self.group_size = group_size
        self.dropout = dropout
        self.classifier_dropout = classifier_dropout
        self.knowledge_distillation = knowledge_distillation
        # Created here: JAX's train step reads the metrics' variables before the first batch.
        self.term_trackers = {name: LastValue(name=name) for name in self.terms()}
        self.built = True  # every variable exists already (loaded): JAX's stateless calls need it built

    def terms(self) -> tuple[str, ...]:
        """The loss terms `fit()` logs."""
        return ("loss", "cross_entropy") + (("distill",) if self.knowledge_distillation else ())

    def scores(self, input_ids: Any, attention_mask: Any, training: bool = False) -> Any:
        """(rows,) float32 logits, with dropout in training."""
        input_ids = ops.cast(input_ids, "int32")
        attention_mask = ops.cast(attention_mask, "int32")
        dropout = self.dropout if training else None
        if dropout is not None and dropout.active:
            hidden = dropout.encode_hidden(self.reranker, input_ids, attention_mask)
        else:
            hidden = self.reranker.encode_hidden(input_ids, attention_mask)
        drop = None
        if dropout is not None and self.classifier_dropout > 0:
            rate = self.classifier_dropout

            def drop(x: Any) -> Any:
                return dropout.drop(x, rate)

        return self.reranker.heads(hidden, input_ids, attention_mask, drop=drop)[SCORES]

    def call(self, inputs: dict, training: bool = False) -> dict:
        logits = self.scores(inputs["input_ids"], inputs["attention_mask"], training)
        return reranker_loss(logits, self.group_size, inputs.get("teacher_scores"))
