"""A fixed, seeded multilingual corpus with a realistic length mix, and the token batches every engine shares.

Texts are built from word lists in eight languages and cut to a target token count with the checkpoint's
own tokenizer, so the length mix holds whichever tokenizer (real or the test one) is used: about a third
short queries (6-32 tokens) and passages of 50-1000 tokens, log-uniform (most passages are short, a few long).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from bgem3_embeddings.batching import length_sorted_batches

WORDS = {
    "en": "the retrieval model maps each passage to a vector and ranks documents by similarity to the query "
    "search engines index millions of pages while users type short questions about weather travel and "
    "health",
    "de": "der schnelle braune Fuchs springt über den faulen Hund und die Suchmaschine findet passende "
    "Dokumente für jede Anfrage in vielen Sprachen",
    "fr": "le modèle de recherche associe chaque passage à un vecteur et classe les documents selon leur "
    "similarité avec la requête de l'utilisateur",
    "es": "el sistema de búsqueda encuentra documentos relevantes para cada pregunta y ordena los "
    "resultados según su similitud con la consulta",
    "ru": "модель поиска сопоставляет каждому тексту вектор и ранжирует документы по сходству с запросом "
    "пользователя на разных языках",
    "zh": "检索 模型 将 每个 段落 映射 为 向量 并 根据 与 查询 的 相似度 "
    "对 文档 进行 排序 搜索 引擎 索引 了 数百万 网页",
    "ja": "検索 モデル は 各 文章 を ベクトル に 変換 し クエリ と の 類似度 "
    "で 文書 を 並べ替え ます 東京 は 日本 の 首都 です",
    "ar": "يقوم نموذج البحث بتحويل كل فقرة إلى متجه ويرتب المستندات حسب تشابهها مع استعلام المستخدم",
}
QUERY_SHARE = 0.35
QUERY_TOKENS = (6, 32)
PASSAGE_TOKENS = (50, 1000)


@dataclass(frozen=True)
class Corpus:
    texts: list[str]
    token_ids: list[list[int]]  # tokenized once with the checkpoint's tokenizer; every engine uses these

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)


def target_lengths(n: int, seed: int) -> list[int]:
    """Token counts: a QUERY_SHARE of short queries, the rest passages log-uniform in PASSAGE_TOKENS."""
    rng = np.random.default_rng(seed)
    lengths = []
    for _ in range(n):
        if rng.random() < QUERY_SHARE:
            lengths.append(int(rng.integers(*QUERY_TOKENS)))
        else:
            lo, hi = map(math.log, PASSAGE_TOKENS)
            lengths.append(int(round(math.exp(rng.uniform(lo, hi)))))
    return lengths


def _draft_text(rng: np.random.Generator, words: int) -> str:
    """`words` words from one language (passages mix in a second one now and then, as real pages do)."""
    langs = sorted(WORDS)
    lang = langs[int(rng.integers(len(langs)))]
    vocab = WORDS[lang].split()
    picks = rng.integers(len(vocab), size=words)
    out = [vocab[i] for i in picks]
    if words > 40 and rng.random() < 0.3:
        other = WORDS[langs[int(rng.integers(len(langs)))]].split()
        at = int(rng.integers(words))
        out[at:at] = [other[i] for i in rng.integers(len(other), size=words // 4)]
    sep = "" if lang in ("zh", "ja") else " "
    return sep.join(out)


def build_corpus(tokenizer: Any, n: int, seed: int = 0, max_length: int = 8192) -> Corpus:
    """n texts with the seeded length mix; texts are cut to their target token count and re-tokenized."""
    rng = np.random.default_rng(seed + 1)
    texts = []
    for target in target_lengths(n, seed):
        words = max(2, target)
        while True:
            draft = _draft_text(rng, words)
            # Cut at a character offset (not decode(ids)): the text keeps its own characters.
            offsets = tokenizer(draft, add_special_tokens=False, return_offsets_mapping=True)[
                "offset_mapping"
            ]
            if len(offsets) >= target - 2:
                break
            words *= 2
        texts.append(draft[: offsets[max(1, target - 2) - 1][1]].strip())
    token_ids = tokenizer(texts, truncation=True, max_length=max_length, add_special_tokens=True)["input_ids"]
    return Corpus(texts=texts, token_ids=[list(t) for t in token_ids])


def shared_batches(token_ids: list[list[int]], batch_size: int, max_tokens: int | None) -> list[list[int]]:
    """Length-sorted batches (indices), as the encoder makes them: every engine runs these exact batches."""
    return [b.tolist() for b in length_sorted_batches([len(t) for t in token_ids], batch_size, max_tokens)]
