"""An Explanation as terminal text: readable in 80 columns (`bgem3 explain`, `bgem3-qdrant search --explain`),
columns aligned by display width (a CJK character or an emoji takes two terminal columns).

    dense 0.6265  sparse 0.1955  colbert 0.7797  all 0.6014
    all = 0.2506 dense + 0.0391 sparse + 0.3119 colbert (weights 0.4/0.2/0.4)
    sparse terms             query   passage    product  share
      GE                    0.2520 x  0.3010 =   0.0759  38.8%
    colbert: query token    best passage token    similarity  share
      BGE                   BGE                       0.9120  12.3%
"""

from __future__ import annotations

import unicodedata

from bgem3_embeddings.explain.result import ExplainedText, Explanation
from bgem3_embeddings.query_text import cut_note

TOKEN_WIDTH = 18  # terminal columns of a token shown in a column
DOTTED_CIRCLE = "\u25cc"  # the base a lone combining mark is shown on (Unicode's convention)
VARIATION_SELECTOR_16 = "\ufe0f"  # "draw the character before me as an emoji"


def char_width(c: str) -> int:
    """Terminal columns of one character: 2 for East Asian wide and fullwidth (CJK, most emoji), 0 for
    combining marks and format characters (zero-width joiner, variation selectors), else 1."""
    if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Terminal columns of `text`: the sum of `char_width`, plus one for a narrow character that
    VARIATION_SELECTOR_16 asks to draw as an emoji (❤️ takes two columns)."""
    emoji_style = sum(
        1
        for before, c in zip(text[:-1], text[1:], strict=True)
        if c == VARIATION_SELECTOR_16 and char_width(before) == 1
    )
    return sum(char_width(c) for c in text) + emoji_style


def pad(text: str, width: int) -> str:
    """`text` and spaces up to `width` terminal columns (f"{text:<{width}}" counts characters instead)."""
    return text + " " * max(0, width - display_width(text))


def _show(text: str, width: int = TOKEN_WIDTH) -> str:
    """A token's characters on one line, at most `width` columns: control characters and newlines visible,
    a lone combining mark on a dotted circle, long ones cut."""
    shown = text.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    shown = "".join(c if c.isprintable() else "?" for c in shown)
    if shown and unicodedata.combining(shown[0]):
        shown = DOTTED_CIRCLE + shown
    if display_width(shown) <= width:
        return shown
    cut = ""
    for c in shown:
        if display_width(cut + c) > width - 1:
            break
        cut += c
    return cut + "…"


def _token(text: ExplainedText, index: int) -> str:
    return _show(text.surface(index).strip() or text.tokens[index].piece)


def summary_lines(e: Explanation) -> list[str]:
    """Each mode's score, then the weighted parts that make `all` (two lines of at most 77 columns)."""
    w = "/".join(f"{x:g}" for x in e.weights)
    return [
        f"dense {e.dense:.4f}  sparse {e.sparse:.4f}  colbert {e.colbert:.4f}  all {e.combined:.4f}",
        f"all = {e.parts['dense']:.4f} dense + {e.parts['sparse']:.4f} sparse + "
        f"{e.parts['colbert']:.4f} colbert (weights {w})",
    ]


def render(
    e: Explanation, top_terms: int = 5, top_matches: int = 8, indent: str = "", query_note: bool = True
) -> list[str]:
    """The explanation's lines: the scores, the top sparse terms, the top ColBERT alignments.

    ColBERT alignments are listed by their contribution, largest first; `top_*` = 0 lists all. A text cut
    at its max length gets a note (`query_note` False: the caller said it once for all its hits).
    """
    lines = [indent + line for line in summary_lines(e)]
    for text, name in ((e.query, "query"), (e.passage, "passage")):
        if text.truncated and (query_note or name != "query"):
            lines.append(f"{indent}note: {cut_note(name, text.token_count, len(text.tokens))}")
    terms = e.sparse_terms[: top_terms or None]
    if terms:
        lines.append(
            f"{indent}{'sparse terms':<24}{'query':>6}   {'passage':>7}   {'product':>8} {'share':>6}"
        )
        for t in terms:
            lines.append(
                f"{indent}  {pad(_show(t.text or t.token), TOKEN_WIDTH + 4)}{t.query_weight:6.4f} x "
                f"{t.passage_weight:7.4f} = {t.product:8.4f} {t.share:6.1%}"
            )
        if len(e.sparse_terms) > len(terms):
            lines.append(f"{indent}  ... {len(e.sparse_terms) - len(terms)} more shared tokens")
    else:
        lines.append(f"{indent}sparse terms: none (no token has a weight in both texts)")
    matches = sorted(e.colbert_matches, key=lambda m: -m.contribution)[: top_matches or None]
    if matches:
        lines.append(
            f"{indent}{'colbert: query token':<24}{'best passage token':<{TOKEN_WIDTH + 4}}"
            f"{'similarity':>10} {'share':>6}"
        )
        for m in matches:
            query_token = pad(_token(e.query, m.query_token), TOKEN_WIDTH + 4)
            passage_token = pad(_token(e.passage, m.passage_token), TOKEN_WIDTH + 4)
            lines.append(f"{indent}  {query_token}{passage_token}{m.similarity:10.4f} {m.share:6.1%}")
        if len(e.colbert_matches) > len(matches):
            lines.append(f"{indent}  ... {len(e.colbert_matches) - len(matches)} more query tokens")
    return lines
