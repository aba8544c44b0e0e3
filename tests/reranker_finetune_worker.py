"""Our reranker fine-tuning loss and gradients on one Keras backend, in a process of its own.

    python -m tests.reranker_finetune_worker BACKEND CHECKPOINT BATCHES.npz OUT.npz

KERAS_BACKEND is set from BACKEND before anything imports Keras (TensorFlow hidden on jax and torch). For
every case of CASES, BATCHES.npz holds the batch FlagEmbedding's reranker dataset and collator made;
OUT.npz gets the loss terms and the gradient of every parameter under its Hugging Face name ([out, in] as
torch holds it), and for SGD_CASE every parameter after one `fit()` step of SGD clipped at MAX_GRAD_NORM.
tests/test_finetune_reranker.py holds them to FlagEmbedding's `CrossEncoderModel` and torch's autograd.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.finetune_exactness import record_gradients, record_sgd_step, worker_main

GROUP_SIZE = 3
# Three training lines (query, positives, negatives, teacher scores), with emoji, CJK and combining marks;
# some longer than the truncated case's lengths.
LINES: list[dict[str, Any]] = [
    {
        "query": "what is bge m3 😀 and how is it trained on many languages",
        "pos": [
            "bge m3 is an embedding model 東京は日本の首都です supporting dense retrieval lexical matching",
            "a second positive about bge",
        ],
        "neg": ["bm25 is bag of words", "cats are nice e\u0301", "the the the"],
        "pos_scores": [3.0, 2.5],
        "neg_scores": [1.0, 0.5, -0.5],
    },
    {
        "query": "definition of bm25 bm25",
        "pos": ["bm25 ranks documents by query terms appearing in each document"],
        "neg": ["dense retrieval with bge"],  # fewer negatives than the group needs: drawn with repetition
        "pos_scores": [2.0],
        "neg_scores": [0.1],
    },
    {
        # a short query beside a long passage: the passage's own cut (passage_max_len + query_max_len // 2)
        # is shorter than the room the pair leaves it
        "query": "bm25",
        "pos": [" ".join(f"word{i} ranks documents" for i in range(40))],
        "neg": ["lexical matching", "sparse vectors of token weights", "a reranker scores pairs"],
        "pos_scores": [1.5],
        "neg_scores": [0.2, 0.3, -0.2],
    },
]
# (name, knowledge distillation, (query_max_len, passage_max_len))
CASES: list[tuple[str, bool, tuple[int, int]]] = [
    ("plain", False, (32, 64)),
    ("kd", True, (32, 64)),
    ("truncated", False, (6, 8)),
]
SGD_CASE = "plain"


def hf_names(model: Any) -> dict[str, tuple[str, bool]]:
    """Variable path -> (Hugging Face name, stored transposed) for every weight of a BGEM3RerankerModel."""
    from bgem3_embeddings.checkpoint.porting import transpose
    from bgem3_embeddings.reranker.loading import reranker_weight_specs

    return {s.variable.path: (s.name, s.transform is transpose) for s in reranker_weight_specs(model)}


def run(checkpoint: Path, batches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import keras

    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.finetune.reranker.train_model import RerankerFinetuner
    from bgem3_embeddings.reranker.loading import build_reranker_model

    out: dict[str, np.ndarray] = {"backend": np.array(keras.backend.backend())}
    for name, kd, _ in CASES:
        model = build_reranker_model(checkpoint_files_in(checkpoint), weights_cache=False)
        names = hf_names(model)
        finetuner = RerankerFinetuner(model, group_size=GROUP_SIZE, knowledge_distillation=kd)
        inputs = {key.split("/", 1)[1]: value for key, value in batches.items() if key.startswith(f"{name}/")}
        record_gradients(out, name, finetuner, inputs, names)
        if name == SGD_CASE:
            record_sgd_step(out, name, finetuner, inputs, model.weights, names)
    return out


if __name__ == "__main__":
    worker_main(run)
