"""The one rule for a query wherever one is searched with, retrieved with or explained: it must hold text.

An empty or whitespace-only query tokenizes to the special tokens alone; its vectors are the same for every
such query, so every ranking it gives (dense, sparse, ColBERT) means nothing. Every place that takes a query
calls `check_query` and says its message: `bgem3 explain`, `bgem3 serve`'s /v1/bgem3/explain,
`bgem3-qdrant search` (with and without --explain), the Searcher, the MCP tools, the page's API, and the
LangChain and LlamaIndex query paths.

Every other text a user sends follows the same rule (`is_blank`, said with `empty_text`), as OpenAI's API
and text-embeddings-inference refuse an empty input: `bgem3 encode`, `bgem3 rerank` and `bgem3 explain`'s
arguments and --file lines (one line, exit 2), every `bgem3 serve` route (400 naming the field), the
page's and the MCP tools' texts. The library itself (`BGEM3Encoder.encode`, `encode_corpus`) still embeds
"" as the reference (FlagEmbedding) does: a program that passes one gets what the reference would store.

A text longer than the model reads is cut at its max length (the query's 512 tokens by default): each place
that cuts one says so once, in `cut_note`'s words (how many tokens it had, how many were read): `bgem3
encode` and `bgem3-qdrant search` on stderr, `bgem3 explain` and the MCP `explain` tool in the explanation's
note (ExplainedText.token_count, also in /v1/bgem3/explain's JSON), the MCP `find` tool as a last line, the
page's search in its `warnings`, `bgem3 serve`'s embedding routes in a `BGEM3-Truncated` header (and
`warnings` on /v1/bgem3/encode and /score), LangChain's and LlamaIndex's query paths in their log
(`log_cut_queries`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EMPTY_QUERY = "the query is empty (or only whitespace): give the words to search with"


def is_blank(text: str) -> bool:
    """The one rule: a text with nothing but whitespace (or nothing) holds no words to embed or search."""
    return not text.strip()


def empty_text(name: str) -> str:
    """The one wording for an empty text a user sent, `name` saying which (an argument, a field)."""
    return f"{name} is empty (or only whitespace): give some text"


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
    if is_blank(query):
        raise EmptyQueryError()
    return query


def cut_note(what: str, tokens: int, kept: int) -> str:
    """The one wording for a text cut at the model's max length; counts include <s> and </s>.

    >>> cut_note("query", 120_345, 512)
    'the query has 120,345 tokens, more than the model reads: only its first 512 were used (max length)'
    """
    return (
        f"the {what} has {tokens:,} tokens, more than the model reads: only its first {kept:,} were used "
        "(max length)"
    )


def token_counts_if_cut(tokenizer: Any, texts: Sequence[str], max_length: int) -> dict[int, int]:
    """{index: its whole token count} for each text cut at `max_length` tokens (none cut: {}).

    One tokenization of the texts whole (no model runs) by a BGEM3Tokenizer (`encoder.tokenizer`, also a
    RemoteEncoder's). A token holds at least one character of the normalized text, and NFKC lengthens a
    character 18 times at most: no text reaches the length tokenized with.
    """
    if not texts:
        return {}
    whole = max(18 * max(len(t) for t in texts) + 2, max_length)
    counts = [len(ids) for ids in tokenizer.encode_batch(list(texts), whole)]
    return {i: n for i, n in enumerate(counts) if n > max_length}


def query_cut_note(encoder: Any, query: str, max_length: int | None = None) -> str | None:
    """`cut_note` for `query` when `encoder` cuts it at `max_length` (default its `query_max_length`)."""
    kept = max_length if max_length is not None else int(getattr(encoder, "query_max_length", 512))
    counts = token_counts_if_cut(encoder.tokenizer, [query], kept)
    return cut_note("query", counts[0], kept) if counts else None


def texts_cut_note(counts: dict[int, int], total: int, kept: int) -> str:
    """`cut_note` for a call over `total` texts, `counts` from `token_counts_if_cut` (one line for all)."""
    if total == 1 and len(counts) == 1:
        return cut_note("text", next(iter(counts.values())), kept)
    shown = sorted(counts.items())[:5]
    listed = ", ".join(f"text {i + 1}: {n:,}" for i, n in shown) + (", ..." if len(counts) > 5 else "")
    return (
        f"{len(counts)} of {total} texts have more tokens than the model reads ({listed}): only the first "
        f"{kept:,} of each were used (max length)"
    )


def log_cut_queries(logger: Any, encoder: Any, queries: Sequence[str], max_length: int | None = None) -> None:
    """Log (WARNING) `cut_note` for each query `encoder` cuts at `max_length` (default its query_max_length).

    For the library integrations (LangChain, LlamaIndex): a program's log is where they say what they did;
    the commands say it on stderr themselves. One tokenization of the queries, no model run. An encoder
    without a `tokenizer` (the integrations take any object with encode_queries / encode_corpus) cannot
    be asked how long a query is: nothing is logged for it.
    """
    if getattr(encoder, "tokenizer", None) is None:
        return
    kept = max_length if max_length is not None else int(getattr(encoder, "query_max_length", 512))
    for count in token_counts_if_cut(encoder.tokenizer, list(queries), kept).values():
        logger.warning("%s", cut_note("query", count, kept))
