"""(query, passage) pairs as FlagReranker builds them: checks of what a caller passes, then token ids.

FlagEmbedding 1.4.2's `FlagReranker.compute_score` (inference/reranker/encoder_only/base.py):
  1. the queries tokenized without special tokens, cut at `max_length * 3 // 4` tokens; the passages the
     same, cut at `max_length`;
  2. each pair joined by `prepare_for_model_compat(q, p, truncation='only_second', max_length)`. On
     transformers 5, which has no id-level `prepare_for_model`, that helper decodes both id lists back to
     text (special tokens kept, no clean-up) and tokenizes the two texts as a pair: the passage alone is cut
     so that `<s> query </s></s> passage </s>` fits in `max_length`; a pair whose passage cannot give up
     enough tokens is an error.
The decode step is kept because it changes the ids (a query cut after a lone '▁' loses it, '▁<unk>' becomes
'<unk>'): the scores equal those of FlagReranker as its users run it today.

    >>> pair_token_ids(tokenizer, [("what is BGE M3?", "an embedding model")], 512)  # doctest: +SKIP
    [[0, ..., 2, 2, ..., 2]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bgem3_embeddings.tokenizer import BGEM3Tokenizer

# <s> query </s></s> passage </s>: four special tokens around a pair.
PAIR_SPECIAL_TOKENS = 4


def query_max_length(max_length: int) -> int:
    """How many tokens of the query FlagReranker keeps: three quarters of max_length."""
    return max_length * 3 // 4


def check_max_length(max_length: Any) -> int:
    """`max_length` when it is an int with room for the four special tokens; ValueError otherwise."""
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < PAIR_SPECIAL_TOKENS:
        raise ValueError(
            f"max_length must be an int >= {PAIR_SPECIAL_TOKENS} (room for <s> q </s></s> p </s>), "
            f"got {max_length!r}"
        )
    return max_length


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def check_pairs(sentence_pairs: Any) -> tuple[list[tuple[str, str]], bool]:
    """(pairs, was_one_pair) from what FlagReranker.compute_score takes: one (query, passage) pair of str,
    or a list of them. TypeError naming the first thing that is not."""
    what = "sentence_pairs must be a (query, passage) pair of str or a list of such pairs"
    if (
        sentence_pairs is None
        or isinstance(sentence_pairs, str | bytes)
        or not isinstance(sentence_pairs, Sequence)
    ):
        raise TypeError(f"{what}, got {_describe(sentence_pairs)}")
    if len(sentence_pairs) == 0:
        return [], False
    if isinstance(sentence_pairs[0], str):  # one pair, as FlagReranker reads a sequence of str
        return [_check_pair(sentence_pairs, "sentence_pairs")], True
    return [_check_pair(pair, f"sentence_pairs[{i}]") for i, pair in enumerate(sentence_pairs)], False


def _check_pair(pair: Any, where: str) -> tuple[str, str]:
    if isinstance(pair, str | bytes) or not isinstance(pair, Sequence) or len(pair) != 2:
        raise TypeError(f"{where} must be a (query, passage) pair of str, got {_describe(pair)}")
    for side, text in zip(("query", "passage"), pair, strict=True):
        if not isinstance(text, str):
            raise TypeError(f"{where}: the {side} must be a str, got {_describe(text)}")
    return str(pair[0]), str(pair[1])


def check_documents(documents: Any) -> list[str]:
    """The passages of `rerank`: a list of str (not one str, which would be read letter by letter)."""
    if documents is None or isinstance(documents, str | bytes) or not isinstance(documents, Sequence):
        raise TypeError(f"documents must be a list of str, got {_describe(documents)}")
    for i, text in enumerate(documents):
        if not isinstance(text, str):
            raise TypeError(f"documents[{i}] must be a str, got {_describe(text)}")
    return list(documents)


class PairTooLongError(ValueError):
    """The query leaves too little room in max_length for the passage to be cut to fit."""


def pair_token_ids(
    tokenizer: BGEM3Tokenizer,
    pairs: Sequence[tuple[str, str]],
    max_length: int,
    *,
    query_length: int | None = None,
    passage_length: int | None = None,
) -> list[list[int]]:
    """Token ids of each pair, `<s> query </s></s> passage </s>`, at most `max_length`, unpadded.

    The query is first cut at `query_length` tokens (FlagReranker's 3/4 of max_length by default), the
    passage at `passage_length` (max_length); FlagEmbedding's reranker training cuts them at its own
    lengths (finetune/reranker/batches.py) and joins them the same way.

    As FlagReranker on transformers 5, a passage that decodes to no text at all ("", or whitespace only)
    gives `<s> query </s>` (the tokenizer then sees no second text).
    """
    if not pairs:
        return []
    backend = tokenizer.backend_tokenizer
    if query_length is None:
        query_length = query_max_length(max_length)
    queries = tokenizer([q for q, _ in pairs], add_special_tokens=False, max_length=query_length)
    passages = tokenizer(
        [p for _, p in pairs], add_special_tokens=False, max_length=passage_length or max_length
    )
    query_texts = backend.decode_batch(queries["input_ids"], skip_special_tokens=False)
    passage_texts = backend.decode_batch(passages["input_ids"], skip_special_tokens=False)
    query_encodings = backend.encode_batch(query_texts, add_special_tokens=False)
    passage_encodings = backend.encode_batch(passage_texts, add_special_tokens=False)
    out = []
    for i, (query, passage, passage_text) in enumerate(
        zip(query_encodings, passage_encodings, passage_texts, strict=True)
    ):
        second = passage if passage_text else None
        specials = backend.num_special_tokens_to_add(second is not None)
        if not _truncate_second(query, second, max_length - specials):  # FlagReranker refuses it too
            raise PairTooLongError(
                f"pair {i}: the query takes {len(query)} tokens, leaving no room for its passage in "
                f"max_length {max_length}: use a larger max_length"
            )
        out.append(backend.post_process(query, second, add_special_tokens=True).ids)
    return out


def _truncate_second(first: Any, second: Any, room: int) -> bool:
    """The tokenizers library's 'only_second' truncation to `room` tokens (special tokens excluded), in
    place: no room at all empties both sides, as that library does; otherwise only the second is cut.
    False when the second cannot give up enough (the library's error)."""
    if room <= 0:
        for encoding in (first, second):
            if encoding is not None:
                encoding.truncate(0)
        return True
    excess = len(first) + (len(second) if second is not None else 0) - room
    if excess <= 0:
        return True
    if second is None or len(second) <= excess:
        return False
    second.truncate(len(second) - excess)
    return True
