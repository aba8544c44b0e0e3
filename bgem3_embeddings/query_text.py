"""The one rule for a query wherever one is searched with, retrieved with or explained: it must hold text.

An empty or whitespace-only query tokenizes to the special tokens alone; its vectors are the same for every
such query, so every ranking it gives (dense, sparse, ColBERT) means nothing. Every place that takes a query
calls `check_query` and says its message: `bgem3 explain`, `bgem3 serve`'s /v1/bgem3/explain,
`bgem3-qdrant search` (with and without --explain), the Searcher, the MCP tools, the page's API, and the
LangChain and LlamaIndex query paths. Plain embedding of texts (the /v1/embeddings, /embed and
/v1/bgem3/encode routes, `encode_corpus`) still embeds "" as the reference (FlagEmbedding) does.
"""

from __future__ import annotations

from typing import Any

EMPTY_QUERY = "the query is empty (or only whitespace): give the words to search with"


class EmptyQueryError(ValueError):
    """A query with no text (empty or whitespace only); the message is `EMPTY_QUERY`."""

    def __init__(self) -> None:
        super().__init__(EMPTY_QUERY)


def check_query(query: Any) -> str:
    """`query` when it is a str with some non-whitespace text; EmptyQueryError or TypeError otherwise.

    >>> check_query("what is BGE-M3?")
    'what is BGE-M3?'
    >>> try:
    ...     check_query("  ")
    ... except EmptyQueryError as err:
    ...     print(err)
    the query is empty (or only whitespace): give the words to search with
    """
    if not isinstance(query, str):
        raise TypeError(f"the query must be text (a str), got {type(query).__name__}")
    if not query.strip():
        raise EmptyQueryError()
    return query
