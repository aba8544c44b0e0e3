"""Our M3 fine-tuning loss, its gradients and one fit() step on one Keras backend, in a process of its own.

    python -m tests.finetune_worker BACKEND CHECKPOINT BATCHES.npz OUT.npz

KERAS_BACKEND is set from BACKEND before anything imports Keras (TensorFlow hidden on jax and torch). For
every case of CASES, BATCHES.npz holds the batch FlagEmbedding's collator made; OUT.npz gets the loss terms
and the gradient of every parameter under its Hugging Face name (layout [out, in] as torch holds it), and,
for SGD_CASE, every parameter after one `fit()` step of SGD clipped at norm MAX_GRAD_NORM.
tests/test_finetune_loss.py holds them to FlagEmbedding's `EncoderOnlyEmbedderM3Model` and torch's
autograd on the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.finetune_exactness import MAX_GRAD_NORM as MAX_GRAD_NORM
from tests.finetune_exactness import SGD_LEARNING_RATE as SGD_LEARNING_RATE
from tests.finetune_exactness import record_gradients, record_sgd_step, worker_main

GROUP_SIZE = 3
# Queries and passages with emoji, CJK and combining marks; some longer than both max lengths below.
FEATURES = [
    (
        "what is bge m3 😀 and how is it trained on many languages",
        [
            "bge m3 is an embedding model 東京は日本の首都です supporting dense retrieval lexical "
            "matching and colbert",
            "bm25 is bag of words",
            "cats are nice e\u0301",
        ],
        [3.0, 1.0, 0.5],
    ),
    (
        "definition of bm25 bm25",
        [
            "bm25 ranks documents by query terms appearing in each document",
            "dense retrieval with bge",
            "the the the the the",
        ],
        [2.0, 0.1, -1.0],
    ),
]
# (name, FlagEmbedding's model keyword arguments, no_in_batch_neg, knowledge distillation, max lengths)
CASES: list[tuple[str, dict[str, Any], bool, bool, tuple[int, int]]] = [
    ("dense", {}, False, False, (32, 64)),
    ("unified", {"unified_finetuning": True}, False, False, (32, 64)),
    ("unified_self_distill", {"unified_finetuning": True, "use_self_distill": True}, False, False, (32, 64)),
    (
        "kd_kl_div",
        {"unified_finetuning": True, "use_self_distill": True, "kd_loss_type": "kl_div"},
        False,
        True,
        (32, 64),
    ),
    ("kd_m3_kd_loss", {"unified_finetuning": True, "kd_loss_type": "m3_kd_loss"}, False, True, (32, 64)),
    ("no_in_batch_neg", {"unified_finetuning": True, "use_self_distill": True}, True, False, (32, 64)),
    ("truncated", {"unified_finetuning": True, "use_self_distill": True}, False, False, (8, 12)),
]
SGD_CASE = "unified_self_distill"
TEMPERATURE = 0.02


def loss_settings(model_kwargs: dict[str, Any], knowledge_distillation: bool) -> Any:
    from bgem3_embeddings.finetune.loss import LossSettings

    return LossSettings(
        temperature=TEMPERATURE,
        unified=model_kwargs.get("unified_finetuning", False),
        self_distill=model_kwargs.get("use_self_distill", False),
        knowledge_distillation=knowledge_distillation,
        kd_loss_type=model_kwargs.get("kd_loss_type", "kl_div"),
    )


def hf_names(model: Any) -> dict[str, tuple[str, bool]]:
    """Variable path -> (Hugging Face name, stored transposed) for every weight of a BGEM3Model."""
    from bgem3_embeddings.checkpoint.porting import encoder_weight_specs, head_weight_specs, transpose

    names = {}
    for spec in encoder_weight_specs(model):
        names[spec.variable.path] = (spec.name, spec.transform is transpose)
    for head in ("colbert_linear", "sparse_linear"):
        for spec in head_weight_specs(getattr(model, head)):
            names[spec.variable.path] = (f"{head}{spec.name}", spec.transform is transpose)
    return names


def run(checkpoint: Path, batches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import keras

    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.finetune.train_model import M3Finetuner
    from bgem3_embeddings.loading import build_model

    out: dict[str, np.ndarray] = {"backend": np.array(keras.backend.backend())}
    for name, model_kwargs, no_in_batch_neg, kd, _ in CASES:
        model, _ = build_model(checkpoint_files_in(checkpoint), precision="float32", weights_cache=False)
        names = hf_names(model)
        finetuner = M3Finetuner(
            model, loss_settings(model_kwargs, kd), group_size=GROUP_SIZE, no_in_batch_neg=no_in_batch_neg
        )
        inputs = {key.split("/", 1)[1]: value for key, value in batches.items() if key.startswith(f"{name}/")}
        record_gradients(out, name, finetuner, inputs, names)
        if name == SGD_CASE:
            record_sgd_step(out, name, finetuner, inputs, model.weights, names)
    return out


if __name__ == "__main__":
    worker_main(run)
