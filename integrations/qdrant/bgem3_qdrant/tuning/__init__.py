"""Tuning a collection's model on its own data (issue 57): no heavy imports here.

    mine.py     training data from a collection and queries (`bgem3-qdrant mine`)
    reindex.py  a collection re-encoded by another model of the same tokenizer (`bgem3-qdrant reindex`)
    loop.py     mine -> finetune -> reindex -> eval in one resumable command (`bgem3-qdrant tune`)
"""
