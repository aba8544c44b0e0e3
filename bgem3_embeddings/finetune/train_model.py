"""The Keras model `fit()` trains: BGE-M3's own layers, the M3 loss on top (no second copy of the network).

`M3Finetuner` wraps a loaded `BGEM3Model`: its call encodes a batch's queries and passages with the
model's layers and returns FlagEmbedding's loss and its terms (loss.py); `compute_loss` hands Keras the
total, so `fit()`'s own train step differentiates it on TensorFlow, JAX and PyTorch alike. With
`sub_batch_size`, GradCache's train step (grad_cache.py) replaces Keras' own: same loss and gradients, the
activations of one sub-batch at a time. The encoder's variables are the ones trained: after `fit()` the
wrapped `BGEM3Model` is the tuned model.

A batch is a dict of arrays (batches.py builds them):
    query_input_ids, query_attention_mask        (B, Lq) int32, right-padded
    passage_input_ids, passage_attention_mask    (B * G, Lp) int32, each query's group in order,
                                                 positive first
    step                                         (B,) int32, the number of steps before this one (all equal)
    no_in_batch_neg                              (B,) int32, 1 for no_in_batch_neg data (all equal)
    teacher_scores                               (B, G) float32, only with knowledge distillation

    >>> finetuner = M3Finetuner(model, LossSettings(unified=True), group_size=8)
    >>> finetuner.compile(optimizer=keras.optimizers.SGD(1e-5))
    >>> finetuner.fit(batches, epochs=1)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from bgem3_embeddings.finetune import grad_cache, grad_cache_route
from bgem3_embeddings.finetune.dropout import EncoderDropout
from bgem3_embeddings.finetune.loss import LossSettings, Representations, m3_loss
from bgem3_embeddings.model import BGEM3Model

# The loss terms `fit()` logs, in this order (a term a setting does not compute is left out).
LOSS_TERMS = ("loss", "dense", "sparse", "colbert", "ensemble", "self_distill")
# no_in_batch_neg for a run whose data holds both kinds (each batch says which it is)
MIXED = "mixed"


class LastValue(keras.metrics.Metric):
    """The value of the last step (Keras' Mean would average over the whole run): `fit()`'s logs and
    progress bar then show each step's loss terms as they are."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.value = self.add_variable(shape=(), initializer="zeros", name="value")

    def update_state(self, value: Any) -> None:
        self.value.assign(ops.cast(value, self.value.dtype))

    def result(self) -> Any:
        return self.value.value

    def reset_state(self) -> None:
        self.value.assign(0.0)


def zero_share(token_weights: Any) -> Any:
    """The share of texts whose sparse vector is all zero (FlagEmbedding #982's collapse), a scalar."""
    empty = ops.cast(ops.equal(ops.max(token_weights, axis=-1), 0.0), "float32")
    return ops.mean(empty)


class TermsModel(keras.Model):
    """A model `fit()` trains whose call returns the loss and its terms (M3Finetuner, the reranker's
    RerankerFinetuner): Keras differentiates the "loss" term, and each of `term_trackers` (a LastValue per
    term, made by the subclass) logs its step's value."""

    term_trackers: dict[str, LastValue]

    def train_step(self, *args: Any) -> Any:
        """Keras' own step; on TensorFlow with the embedding rows summed before clipping (step_tf.py)."""
        if keras.backend.backend() == "tensorflow":
            from bgem3_embeddings.finetune import step_tf

            return step_tf.train_step(self, *args)
        return super().train_step(*args)

    def compute_loss(
        self,
        x: Any = None,
        y: Any = None,
        y_pred: Any = None,
        sample_weight: Any = None,
        training: bool = True,
    ) -> Any:
        return y_pred["loss"]

    def compute_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> dict:
        for name, tracker in self.term_trackers.items():
            tracker.update_state(y_pred[name])
        return {name: tracker.result() for name, tracker in self.term_trackers.items()}

    @property
    def metrics(self) -> list:
        return list(self.term_trackers.values())


class M3Finetuner(TermsModel):
    """FlagEmbedding's `EncoderOnlyEmbedderM3Model` in training mode, on a `BGEM3Model`'s layers."""

    def __init__(
        self,
        encoder: BGEM3Model,
        settings: LossSettings,
        *,
        group_size: int,
        no_in_batch_neg: bool | str = False,
        dropout: EncoderDropout | None = None,
        sub_batch_size: int | None = None,
        devices: int = 1,
        negatives_cross_device: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(name="m3_finetuner", **kwargs)
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        if sub_batch_size is not None and sub_batch_size < 1:
            raise ValueError(f"sub_batch_size must be at least 1, got {sub_batch_size}")
        if devices < 1:
            raise ValueError(f"devices must be at least 1, got {devices}")
        self.encoder = encoder
        self.settings = settings
        self.group_size = group_size
        self.no_in_batch_neg = no_in_batch_neg
        self.dropout = dropout
        self.sub_batch_size = sub_batch_size  # GradCache's rows per encoder pass (None: the whole batch)
        # A data-parallel step's batch is `devices` blocks, one per device (loss.m3_loss forms the terms
        # per block, and with negatives_cross_device the dense term over them all).
        self.devices = devices
        self.negatives_cross_device = negatives_cross_device
        self.term_trackers = {name: LastValue(name=name) for name in self.terms()}
        # Every variable exists already (the encoder's are loaded): JAX's stateless calls need it built.
        self.built = True

    def terms(self) -> tuple[str, ...]:
        """The loss terms these settings compute."""
        if not self.settings.unified:
            return ("loss", "dense")
        names = ("loss", "dense", "sparse", "colbert", "ensemble")
        return names + (("self_distill",) if self.settings.self_distill else ()) + ("sparse_zero_share",)

    def represent(self, input_ids: Any, attention_mask: Any, training: bool) -> Representations:
        """One side's dense, sparse token weights and ColBERT vectors (FlagEmbedding's `_encode`)."""
        input_ids = ops.cast(input_ids, "int32")
        attention_mask = ops.cast(attention_mask, "int32")
        if training and self.dropout is not None and self.dropout.active:
            hidden = self.dropout.encode_hidden(self.encoder, input_ids, attention_mask)
        else:
            hidden = self.encoder.encode_hidden(input_ids, attention_mask)
        wanted = (
            ("dense_vecs", "sparse_weights", "colbert_vecs") if self.settings.unified else ("dense_vecs",)
        )
        out = self.encoder.heads(hidden, input_ids, attention_mask, wanted)
        return Representations(
            dense=out["dense_vecs"],
            token_weights=out.get("sparse_weights"),
            input_ids=input_ids,
            colbert=out.get("colbert_vecs"),
            mask=attention_mask,
        )

    def call(self, inputs: dict, training: bool = False) -> dict:
        q = self.represent(inputs["query_input_ids"], inputs["query_attention_mask"], training)
        p = self.represent(inputs["passage_input_ids"], inputs["passage_attention_mask"], training)
        return self.loss_terms(q, p, inputs)

    def loss_terms(self, q: Representations, p: Representations, inputs: dict) -> dict:
        """The loss and its terms from both sides' representations (GradCache forms them apart)."""

        def loss(no_in_batch_neg: bool) -> dict:
            return m3_loss(
                q,
                p,
                self.settings,
                step=inputs["step"][0],
                teacher_scores=inputs.get("teacher_scores"),
                group_size=self.group_size,
                no_in_batch_neg=no_in_batch_neg,
                devices=self.devices,
                negatives_cross_device=self.negatives_cross_device,
            )

        if self.no_in_batch_neg != MIXED:
            terms = loss(bool(self.no_in_batch_neg))
        else:
            # Data of both kinds: each batch is of one (data.epoch_batches), told by its input. Both losses
            # are formed (their scores are small beside the encoder's work) and the batch's kind picks one.
            flag = ops.greater(inputs["no_in_batch_neg"][0], 0)
            with_negatives, without = loss(False), loss(True)
            terms = {name: ops.where(flag, without[name], value) for name, value in with_negatives.items()}
        if self.settings.unified:
            terms["sparse_zero_share"] = zero_share(p.token_weights)
        return terms

    def train_step(self, *args: Any) -> Any:
        """TermsModel's step, or GradCache's when `sub_batch_size` splits the batch (the arguments are the
        backend's: (data) on TensorFlow and PyTorch, (state, data) on JAX)."""
        if grad_cache.splits(self, args[-1]):
            return grad_cache_route.train_step(self, *args)
        logs = super().train_step(*args)
        if keras.backend.backend() == "torch":
            # Keras frees the gradients at the next step's zero_grad(), after its forward pass: freed
            # now, they (2.27 GB at full size) are not held beside that forward's activations.
            self.zero_grad()
        return logs
