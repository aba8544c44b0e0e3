"""`bgem3 finetune-reranker`: FlagEmbedding's cross-encoder fine-tuning
(`finetune.reranker.encoder_only.base`) on the project's Keras reranker, on TensorFlow, JAX and PyTorch.

- options.py: `RerankerFinetuneOptions`, FlagEmbedding's argument names and defaults, then ours.
- batches.py: each group's (query, passage) pairs joined and padded as its dataset and collator do.
- loss.py: cross-entropy over each group's logits, plus knowledge distillation from teacher scores.
- train_model.py: `RerankerFinetuner`, the Keras model `fit()` trains.
- save.py: the output folder in bge-reranker-v2-m3's layout (FlagReranker loads it).
- trainer.py: `run_reranker_finetune(options)`; cli.py: the command.

Sampling, the step plan, the optimizer and schedule, checkpoints, resume and LoRA are the embedder's
(finetune/): only what differs for a cross-encoder lives here.
"""
