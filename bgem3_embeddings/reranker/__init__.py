"""BAAI's cross-encoder reranker (bge-reranker-v2-m3) on the project's XLM-RoBERTa backbone.

- model.py: `BGEM3RerankerModel`, the Keras network (encoder + classification head, one logit per pair).
- loading.py: config check and weight porting from the official files (through loading.build_with_weights).
- pairs.py: FlagReranker's pair building (query cut at 3/4 of max_length, 'only_second' truncation).
- reranker.py: `BGEM3Reranker`, the library API (`compute_score`, `rerank`).
- cli.py: `bgem3 rerank`.
"""

# Here, not in reranker.py, so that `bgem3 rerank --help` and the server's options read them without Keras.
DEFAULT_RERANKER_ID = "BAAI/bge-reranker-v2-m3"
DEFAULT_MAX_LENGTH = 512  # tokens of a (query, passage) pair: FlagReranker's default
