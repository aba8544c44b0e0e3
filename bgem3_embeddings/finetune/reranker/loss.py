"""FlagEmbedding's reranker loss in keras.ops (`AbsRerankerModel.forward` in training mode).

Each group's G logits (its positive first) form one row; the loss is the cross-entropy towards column 0,
averaged over the groups, plus, with knowledge distillation, -mean(sum(log_softmax(logits) *
softmax(teacher scores))) over the same rows. FlagEmbedding views the logits as (per_device_train_batch_size,
-1), which mis-groups a last batch with fewer groups; here the rows are always the batch's own groups.

    >>> terms = reranker_loss(logits, group_size=8)   # {"loss": ..., "cross_entropy": ...}  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from keras import ops

from bgem3_embeddings.finetune.loss import cross_entropy, distill_kl_div


def reranker_loss(logits: Any, group_size: int, teacher_scores: Any | None = None) -> dict[str, Any]:
    """{"loss", "cross_entropy"[, "distill"]} from (B * G,) logits and optional (B, G) teacher scores."""
    grouped = ops.reshape(logits, (-1, group_size))
    targets = ops.zeros((ops.shape(grouped)[0],), dtype="int32")
    ce = cross_entropy(grouped, targets)
    terms = {"loss": ce, "cross_entropy": ce}
    if teacher_scores is not None:
        teacher = ops.stop_gradient(ops.softmax(ops.reshape(teacher_scores, (-1, group_size)), axis=-1))
        distill = distill_kl_div(teacher, grouped)
        terms |= {"loss": ce + distill, "distill": distill}
    return terms
