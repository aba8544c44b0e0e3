"""Token-aware chunking with overlap, using the encoder's own tokenizer."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Chunk:
    """One piece of a document: its text, position and token count (without special tokens)."""

    text: str
    index: int
    start: int  # character offsets into the document text
    end: int
    n_tokens: int


def plain_backend(tokenizer: Any) -> Any:
    """A private copy of a fast tokenizer's backend with truncation and padding off, or None.

    transformers sets truncation on the shared backend at every call (the encoder truncates to its
    max_length), so using that object directly would silently cut long documents.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    backend = copy.deepcopy(backend)
    backend.no_truncation()
    backend.no_padding()
    return backend


def _offsets(tokenizer: Any, text: str, backend: Any = None) -> list[tuple[int, int]]:
    """Character offsets of the tokens of `text`, special tokens excluded."""
    if backend is not None:
        # The backend skips transformers' "sequence longer than max length" warning, which is
        # expected here: long documents are what we are about to split.
        enc = backend.encode(text, add_special_tokens=False)
        offsets = list(enc.offsets)
    else:
        out = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, truncation=False)
        offsets = list(out["offset_mapping"])
    # Some tokenizers emit zero-width tokens (e.g. a lone "▁"); they carry no text.
    return [(int(s), int(e)) for s, e in offsets if e > s]


def _is_word_start(offsets: list[tuple[int, int]], i: int, text: str) -> bool:
    """True if token i begins a new word (whitespace before it), so cutting there splits no word."""
    if i == 0:
        return True
    prev_start, prev_end = offsets[i - 1]
    start = offsets[i][0]
    if start <= prev_start:
        # Same start as the token before (e.g. "▁" then "w" both mapped to "w"): a continuation.
        return False
    return start > prev_end or (start > 0 and text[start - 1].isspace())


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """(start, end) moved inwards past surrounding whitespace.

    Token offsets can include the space a "▁word" token stands for, or end on a whitespace token;
    the stored text must be exactly what is encoded, and the reference tokenizer drops such edge
    whitespace, so the chunk is the trimmed slice (still an exact slice of the document).
    """
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


class Chunker:
    """chunk_text with a fixed tokenizer and sizes (keeps one private backend copy)."""

    def __init__(self, tokenizer: Any, chunk_size: int = 512, overlap: int = 64) -> None:
        check_sizes(chunk_size, overlap)
        self.tokenizer = tokenizer
        self.chunk_size = chunk_size
        self.overlap = overlap
        self._backend = plain_backend(tokenizer)

    def __call__(self, text: str) -> list[Chunk]:
        return chunk_text(text, self.tokenizer, self.chunk_size, self.overlap, _backend=self._backend)


def check_sizes(chunk_size: int, overlap: int) -> None:
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    if not 0 <= overlap < chunk_size:
        raise ValueError("overlap must be >= 0 and smaller than chunk_size")


def chunk_text(
    text: str, tokenizer: Any, chunk_size: int = 512, overlap: int = 64, *, _backend: Any = None
) -> list[Chunk]:
    """Split `text` into chunks of at most `chunk_size` tokens, consecutive chunks sharing `overlap`.

    Cuts are moved back to a word boundary when one lies in the last quarter of the window, so words
    are not split in languages that separate words with spaces; other text is cut between tokens.
    Every chunk's text is `text[start:end]` without surrounding whitespace. Whitespace-only text
    gives no chunks, and a window holding only whitespace tokens is dropped rather than stored as an
    empty point (the reference would encode "" as just <s></s>: a vector of no content).
    """
    check_sizes(chunk_size, overlap)
    if not text.strip():
        return []
    backend = _backend if _backend is not None else plain_backend(tokenizer)
    offsets = _offsets(tokenizer, text, backend)
    if not offsets:
        return []
    n = len(offsets)
    chunks: list[Chunk] = []
    start = 0
    while True:
        end = min(start + chunk_size, n)
        if end < n:
            floor = start + max(1, (3 * chunk_size) // 4)
            for j in range(end, floor - 1, -1):
                if j < n and _is_word_start(offsets, j, text):
                    end = j
                    break
        c_start, c_end = _trimmed(text, offsets[start][0], offsets[end - 1][1])
        if c_end > c_start:
            # Tokens that cover only trimmed whitespace are not part of the chunk any more.
            n_tok = sum(1 for s, e in offsets[start:end] if e > c_start and s < c_end)
            chunks.append(Chunk(text[c_start:c_end], len(chunks), c_start, c_end, n_tok))
        if end >= n:
            break
        nxt = max(start + 1, end - overlap)
        # Start the next chunk on a word boundary: the nearest one after the overlap point (less
        # overlap), else before it (more overlap); text without spaces keeps the token cut.
        candidates = [*range(nxt, end), *range(nxt - 1, start, -1)]
        nxt = next((j for j in candidates if _is_word_start(offsets, j, text)), nxt)
        start = nxt
    return chunks
