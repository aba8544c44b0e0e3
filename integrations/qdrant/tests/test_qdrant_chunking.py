"""Token-aware chunking: sizes, overlap, offsets, word boundaries, determinism."""

from __future__ import annotations

from typing import Any

import pytest
from bgem3_qdrant.chunking import Chunker, chunk_text
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


@pytest.fixture(scope="module")
def word_tokenizer() -> Any:
    """A whitespace word-level tokenizer with the transformers call interface (no model needed)."""
    words = [
        "the",
        "a",
        "of",
        "and",
        "to",
        "in",
        "is",
        "it",
        "on",
        "with",
        "as",
        "for",
        "by",
        "at",
        "from",
        "this",
        "that",
        "be",
        "are",
        "was",
        "alpha",
        "beta",
        "gamma",
    ]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def test_chunks_respect_size_and_overlap(word_tokenizer: Any) -> None:
    text = " ".join(f"w{i}" for i in range(100))
    chunks = chunk_text(text, word_tokenizer, chunk_size=10, overlap=3)
    assert all(c.n_tokens <= 10 for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    # Every word is covered, and consecutive chunks share exactly `overlap` words.
    words = [c.text.split() for c in chunks]
    assert words[0][0] == "w0" and words[-1][-1] == "w99"
    for a, b in zip(words, words[1:], strict=False):
        assert a[-3:] == b[:3]
    for c in chunks:
        assert text[c.start : c.end] == c.text


def test_whitespace_only_and_short_texts(word_tokenizer: Any) -> None:
    assert chunk_text("   \n\t ", word_tokenizer, 10, 2) == []
    (only,) = chunk_text("  alpha beta  ", word_tokenizer, 10, 2)
    assert only.text == "alpha beta" and only.n_tokens == 2


def test_invalid_sizes(word_tokenizer: Any) -> None:
    with pytest.raises(ValueError):
        chunk_text("a", word_tokenizer, 0, 0)
    with pytest.raises(ValueError):
        chunk_text("a", word_tokenizer, 4, 4)


def test_real_tokenizer_cuts_at_word_boundaries(encoder: Any) -> None:
    text = ("Separated bike lanes follow the river and the long boulevards of the city. " * 20).strip()
    chunker = Chunker(encoder.tokenizer, chunk_size=24, overlap=4)
    chunks = chunker(text)
    assert len(chunks) > 3
    for c in chunks:
        assert c.n_tokens <= 24
        assert text[c.start : c.end] == c.text
        # Cuts fall between words: each chunk starts and ends on a word edge.
        assert c.start == 0 or text[c.start - 1] == " "
        assert c.end == len(text) or text[c.end] in " ."
    assert chunker(text) == chunks  # deterministic


def test_long_document_not_truncated_by_encoder_state(encoder: Any) -> None:
    """The encoder sets truncation on the shared tokenizer; chunking must still see the whole text."""
    text = "alpha beta gamma delta " * 400
    encoder.encode_corpus(["warm up"], max_length=16)  # leaves truncation=16 on the shared backend
    chunks = Chunker(encoder.tokenizer, chunk_size=64, overlap=0)(text)
    assert chunks[-1].end == len(text.rstrip())


def test_chunks_trimmed_with_published_pretokenizer(tiny_checkpoint: Any) -> None:
    """The published BGE-M3 tokenizer.json pre-tokenizes with Metaspace alone, so a token's offsets
    include the space it replaces and a lone "▁" token covers a space: a window may start or end on
    whitespace. Every chunk must still be the trimmed, exact slice of the document."""
    tok = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    published_like = PreTrainedTokenizerFast(tokenizer_object=tok)
    text = (
        "of those best matches. Rerank the hybrid candidates with ColBERT.\n\n"
        "  Separated   bike lanes follow the Seine;\tshared bicycles stand everywhere.  \n"
    ) * 6
    for size, overlap in ((7, 2), (12, 3), (40, 8)):
        chunks = chunk_text(text, published_like, size, overlap)
        assert chunks, size
        for c in chunks:
            assert c.text == c.text.strip() and c.text
            assert text[c.start : c.end] == c.text
        assert [c.index for c in chunks] == list(range(len(chunks)))
    offsets = tok.encode(text, add_special_tokens=False).offsets
    # The tokenizer really emits whitespace-covering tokens (the case under test).
    assert any(text[s:e].isspace() for s, e in offsets)
