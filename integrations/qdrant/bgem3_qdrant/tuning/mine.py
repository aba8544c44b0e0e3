"""Training data from a collection: hard negatives mined as FlagEmbedding's `scripts/hn_mine.py` does,
over the vectors the collection already stores (`bgem3-qdrant mine`).

For each query (query_sets.py), as hn_mine's `find_knn_neg`:
1. its dense vector from the collection's own model (`encode_queries`), searched exactly (brute force, as
   hn_mine's faiss IndexFlatIP) against the stored dense vectors for the first `end` chunks, where
   `range_for_sampling` = (start, end), chunks of equal text counted once (hn_mine's corpus is a set);
2. the chunks at ranks start..end-1 (0-based: hn_mine's `inxs[start:end]`, so 2-200 skips the best two),
   less the positives and the query's own text;
3. `negative_number` of them drawn with `random.Random(seed).sample` when there are more, else all in rank
   order; too few are filled up with chunks drawn at random from the whole collection, as hn_mine does.

Where the unit differs: a collection stores chunks of documents, so a chunk of any positive document is
never a negative, and a BEIR positive (a document id) is written as its chunk the model ranks highest for
the query (a document scores as its best chunk in `eval` too). JSONL positives are stored chunk texts.

`teacher_reranker` adds `pos_scores` / `neg_scores`: the cross-encoder's logits of each (query, passage)
pair, as FlagEmbedding's `scripts/add_reranker_score.py` (compute_score, not normalized) adds them.
`holdout` sets a seeded share of the usable queries apart before anything is mined: written as a BEIR
folder for `eval`, never searched for negatives (mine_output.py has the layout).

    report = mine_collection(store, "kb", Path("queries.jsonl"), Path("mined"), holdout=0.2)
    print(report.format())
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..encoder import EncoderLike
from ..errors import BGEM3QdrantError
from ..filters import doc_filter
from ..identity import ensure_model, identity_of
from ..payload import DOC_ID, TEXT
from ..stores.base import BGEM3Store, QuerySpec
from ..stores.open import as_store
from ..wording import counted
from .mine_output import check_output, write_holdout, write_report, write_train
from .query_sets import MineQuery, read_query_set

logger = logging.getLogger(__name__)

NEGATIVE_NUMBER = 15  # hn_mine's default
RANGE_FOR_SAMPLING = (2, 200)  # issue 57's default (hn_mine's is 10-210)
SEED = 42
NAMED = 5  # skipped queries named in the summary line (all of them are in mine.json)


@dataclass(frozen=True)
class Chunk:
    """A stored chunk as mining sees it: its document and text."""

    doc_id: str
    text: str


@dataclass
class MineReport:
    """What a mining run read, wrote and skipped (`format()`: the summary line; `to_json()`: mine.json)."""

    collection: str
    model: str
    queries: str
    out_dir: Path
    settings: dict[str, Any]
    read: int
    mined: int
    held_out: int
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> query ids
    positives_missing: int = 0  # positives not in the collection (dropped from queries that kept others)
    negatives: int = 0
    filled_at_random: int = 0  # negatives drawn from the whole collection (too few in the range)
    teacher: str | None = None

    @property
    def train_file(self) -> Path:
        from .mine_output import TRAIN_FILE

        return self.out_dir / TRAIN_FILE

    @property
    def holdout_dir(self) -> Path | None:
        from .mine_output import HOLDOUT_DIR

        return self.out_dir / HOLDOUT_DIR if self.held_out else None

    def format(self) -> str:
        s = self.settings
        start, end = s["range_for_sampling"]
        parts = [
            f"mined {self.mined} of {counted(self.read, 'query', 'queries')} from {self.collection!r} into "
            f"{self.train_file} ({counted(self.negatives, 'negative')}, up to {s['negative_number']} a query "
            f"from ranks {start}-{end}, seed {s['seed']}"
            + (f"; {self.filled_at_random} drawn from the whole collection" if self.filled_at_random else "")
            + (f"; teacher scores from {self.teacher}" if self.teacher else "")
            + ")"
        ]
        if self.held_out:
            parts.append(f"{self.held_out} held out in {self.holdout_dir}")
        for reason, ids in self.skipped.items():
            if ids:
                named = ", ".join(ids[:NAMED]) + (", ..." if len(ids) > NAMED else "")
                parts.append(f"skipped {len(ids)} {reason} ({named})")
        if self.positives_missing:
            parts.append(f"{counted(self.positives_missing, 'positive')} not in the collection left out")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "model": self.model,
            "queries": self.queries,
            **self.settings,
            "range_for_sampling": list(self.settings["range_for_sampling"]),
            "teacher_reranker": self.teacher,
            "read": self.read,
            "mined": self.mined,
            "held_out": self.held_out,
            "skipped": self.skipped,
            "positives_missing": self.positives_missing,
            "negatives": self.negatives,
            "filled_at_random": self.filled_at_random,
        }


# Skip reasons, as the summary line says them.
EMPTY_TEXT = "with an empty text"
NO_POSITIVE = "without a positive"
NOT_STORED = "whose positives are not in the collection"


def parse_range(text: str) -> tuple[int, int]:
    """`--range-for-sampling START-END` as hn_mine reads it: 0-based ranks START..END-1."""
    try:
        start, end = (int(x) for x in text.split("-"))
    except ValueError:
        raise BGEM3QdrantError(f"--range-for-sampling takes START-END, e.g. 2-200, not {text!r}") from None
    return start, end


def check_settings(negative_number: int, range_for_sampling: tuple[int, int], holdout: float) -> None:
    start, end = range_for_sampling
    if negative_number < 1:
        raise BGEM3QdrantError(f"--negative-number must be at least 1, got {negative_number}")
    if not 0 <= start < end:
        raise BGEM3QdrantError(
            f"--range-for-sampling {start}-{end}: START must be at least 0 and below END (e.g. 2-200)"
        )
    if not 0 <= holdout < 1:
        raise BGEM3QdrantError(
            f"--holdout is the share of queries set apart, from 0 to below 1, got {holdout}"
        )


def sample_negatives(
    ranked: Sequence[Chunk],
    *,
    query: str,
    positive_docs: set[str],
    positive_texts: set[str],
    negative_number: int,
    range_for_sampling: tuple[int, int],
    rng: random.Random,
) -> list[str]:
    """hn_mine's choice from one query's ranking (best first): ranks start..end-1 of the distinct texts,
    positives (any chunk of a positive document, any positive text) and the query's text left out, then
    `rng.sample` of `negative_number` when more remain, else all of them in rank order."""
    start, end = range_for_sampling
    seen: set[str] = set()
    distinct = []
    for c in ranked:
        if c.text not in seen:
            seen.add(c.text)
            distinct.append(c)
    kept = [
        c.text
        for c in distinct[start:end]
        if c.doc_id not in positive_docs and c.text not in positive_texts and c.text != query
    ]
    if len(kept) > negative_number:
        kept = rng.sample(kept, negative_number)
    return kept


def fill_negatives(
    negatives: list[str],
    corpus: Sequence[Chunk],
    *,
    query: str,
    positive_docs: set[str],
    positive_texts: set[str],
    negative_number: int,
    rng: random.Random,
) -> list[str]:
    """hn_mine's fill-up of a short list: texts drawn at random from the whole collection (never a
    positive, the query's text or one already chosen), as many as there are."""
    need = negative_number - len(negatives)
    if need <= 0:
        return negatives
    chosen = set(negatives)
    pool = sorted(
        {
            c.text
            for c in corpus
            if c.doc_id not in positive_docs
            and c.text not in positive_texts
            and c.text != query
            and c.text not in chosen
        }
    )
    return negatives + rng.sample(pool, min(need, len(pool)))


class _Collection:
    """The collection's chunks, read once when first needed (JSONL positives, fill-ups)."""

    def __init__(self, store: BGEM3Store, name: str) -> None:
        self.store, self.name = store, name
        self._chunks: list[Chunk] | None = None

    @property
    def chunks(self) -> list[Chunk]:
        if self._chunks is None:
            points = self.store.iter_points(self.name, with_payload=[DOC_ID, TEXT])
            self._chunks = [
                Chunk(str(p.payload.get(DOC_ID, p.id)), str(p.payload.get(TEXT, ""))) for p in points
            ]
        return self._chunks

    def docs_of_texts(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for c in self.chunks:
            out.setdefault(c.text, set()).add(c.doc_id)
        return out

    def doc_chunks(self, doc_ids: Sequence[str], dense_name: str) -> dict[str, list[tuple[str, np.ndarray]]]:
        """doc id -> [(chunk text, stored dense vector)] of the documents the collection holds."""
        out: dict[str, list[tuple[str, np.ndarray]]] = {}
        ids = sorted(set(doc_ids))
        for at in range(0, len(ids), 1000):
            points = self.store.iter_points(
                self.name, filter=doc_filter(ids[at : at + 1000]), with_payload=[DOC_ID, TEXT],
                with_vectors=[dense_name],
            )  # fmt: skip
            for p in points:
                vec = np.asarray(p.vectors[dense_name], dtype=np.float32)
                out.setdefault(str(p.payload[DOC_ID]), []).append((str(p.payload.get(TEXT, "")), vec))
        return out


@dataclass
class _Usable:
    """A query with the positives the collection holds."""

    query: MineQuery
    docs: dict[str, int]  # positive doc id -> grade
    texts: list[str]  # JSONL: the positive texts found; BEIR: chosen after encoding (best chunk)


def _resolve(
    queries: list[MineQuery], coll: _Collection, dense_name: str
) -> tuple[list[_Usable], dict[str, list[str]], int, dict[str, list[tuple[str, np.ndarray]]]]:
    """The usable queries, the skipped ones by reason, the positives not stored, and (BEIR) the stored
    chunks of every positive document."""
    skipped: dict[str, list[str]] = {EMPTY_TEXT: [], NO_POSITIVE: [], NOT_STORED: []}
    missing = 0
    usable: list[_Usable] = []
    beir_docs = [d for q in queries for d in q.positive_docs]
    chunks = coll.doc_chunks(beir_docs, dense_name) if beir_docs else {}
    by_text = coll.docs_of_texts() if any(q.positive_texts for q in queries) else {}
    for q in queries:
        if not q.text.strip():
            skipped[EMPTY_TEXT].append(q.id)
            continue
        if not q.positive_docs and not q.positive_texts:
            skipped[NO_POSITIVE].append(q.id)
            continue
        if q.positive_docs:
            docs = {d: g for d, g in q.positive_docs.items() if d in chunks}
            texts: list[str] = []
            missing += len(q.positive_docs) - len(docs)
        else:
            texts = [t for t in dict.fromkeys(q.positive_texts) if t in by_text]
            docs = {d: 1 for t in texts for d in sorted(by_text[t])}
            missing += len(set(q.positive_texts)) - len(texts)
        if not docs:
            skipped[NOT_STORED].append(q.id)
            continue
        usable.append(_Usable(q, docs, texts))
    return usable, skipped, missing, chunks


def _nothing_to_mine(
    queries: Path, collection: str, read: int, skipped: dict[str, list[str]]
) -> BGEM3QdrantError:
    """Every query skipped: one line saying why, by reason."""
    why = ", ".join(f"{len(ids)} {reason}" for reason, ids in skipped.items() if ids)
    hint = (
        "; mine the collection their documents were ingested into (BEIR ids are matched to the payload's "
        "doc_id, JSONL positives to stored chunk texts)"
        if skipped[NOT_STORED]
        else ""
    )
    return BGEM3QdrantError(
        f"none of the {counted(read, 'query', 'queries')} in {queries} can be mined from collection "
        f"{collection!r} (QUERIES, --collection): {why}{hint}"
    )


def split_holdout(n: int, holdout: float, seed: int, eligible: Sequence[int] | None = None) -> set[int]:
    """The indices of the queries set apart: round(holdout * n) of them (at least 1 when holdout > 0), drawn
    from `eligible` (default: all n; as many as there are when fewer) by a seeded stream of their own."""
    if holdout <= 0:
        return set()
    k = max(1, round(holdout * n))
    if k >= n:
        raise BGEM3QdrantError(
            f"--holdout {holdout} of {counted(n, 'usable query', 'usable queries')} leaves none to mine: "
            "lower it, or give more queries"
        )
    pool = list(range(n)) if eligible is None else list(eligible)
    return set(random.Random(f"holdout-{seed}").sample(pool, min(k, len(pool))))


def _load_encoder(store: BGEM3Store, collection: str, model: str | None, load_options: dict[str, Any]) -> Any:
    from bgem3_embeddings.cli_support import check_inputs

    from ..commands.common import collection_model
    from ..encoder import load_encoder

    model_id = collection_model(store, collection, model)
    check_inputs(model_id)
    return load_encoder(model_id, **load_options)


def _teacher(teacher: Any, load_options: dict[str, Any]) -> Any:
    if teacher is None or not isinstance(teacher, str):
        return teacher
    from ..commands.common import load_reranker_option

    return load_reranker_option(
        teacher, load_options.get("precision", "auto"), load_options.get("device", "auto")
    )


def mine_collection(
    store: Any,
    collection: str,
    queries: Path,
    out_dir: Path,
    *,
    negative_number: int = NEGATIVE_NUMBER,
    range_for_sampling: tuple[int, int] = RANGE_FOR_SAMPLING,
    holdout: float = 0.0,
    seed: int = SEED,
    teacher_reranker: Any = None,
    encoder: EncoderLike | None = None,
    model: str | None = None,
    load_options: dict[str, Any] | None = None,
    split: str = "test",
    overwrite: bool = False,
    batch_size: int = 32,
    show_progress: bool | None = None,
) -> MineReport:
    """Mine `collection` for the queries at `queries` (a BEIR folder, its `split`, or FlagEmbedding JSONL)
    and write `out_dir` (mine_output.py). `encoder`: the collection's model, loaded when None (`model`,
    else the one the collection records; `load_options` such as precision/device go to its loader);
    `teacher_reranker`: a BGEM3Reranker, or a model name/folder to load. Inputs are checked in this order,
    each one line (BGEM3QdrantError), before any model loads: the settings, the output, the queries, the
    collection; then the model is checked against the collection. Nothing in the store is written."""
    opts = dict(load_options or {})
    check_settings(negative_number, range_for_sampling, holdout)
    out = Path(out_dir)
    check_output(out, overwrite)
    query_set = read_query_set(queries, split)
    st = as_store(store)
    if not st.collection_exists(collection):
        raise st.missing(collection)
    if st.count(collection) == 0:
        raise BGEM3QdrantError(
            f"collection {collection!r} is empty (--collection): ingest its documents first"
        )
    schema = st.stored_schema(collection)
    coll = _Collection(st, collection)
    usable, skipped, missing, doc_chunks = _resolve(query_set, coll, schema.dense_name)
    if not usable:
        raise _nothing_to_mine(queries, collection, len(query_set), skipped)
    # A held-out query is written to a qrels file, whose fields are split on whitespace: one whose positive
    # document id holds whitespace (a file path with a space) stays in training.
    tsv_safe = [i for i, u in enumerate(usable) if not any(ch.isspace() for d in u.docs for ch in d)]
    held = split_holdout(len(usable), holdout, seed, tsv_safe)
    train = [u for i, u in enumerate(usable) if i not in held]

    if encoder is None:
        encoder = _load_encoder(st, collection, model, opts)
    ensure_model(st, collection, identity_of(encoder), write=False)  # another model: one line, nothing read
    reranker = _teacher(teacher_reranker, opts)
    model_id = str(getattr(encoder, "model_id", model or "unknown"))

    rng = random.Random(seed)  # hn_mine draws from the module's `random`, seeded once
    dense = _encode(encoder, [u.query.text for u in train], batch_size)
    lines: list[dict[str, Any]] = []
    filled = 0
    bar = _progress(len(train), show_progress)
    try:
        for u, vec in zip(train, dense, strict=True):
            if not u.texts:  # BEIR: each positive document as its chunk the model ranks highest
                u.texts = [max(doc_chunks[d], key=lambda c: float(vec @ c[1]))[0] for d in u.docs]
            pos_docs, pos_texts = set(u.docs), set(u.texts)
            ranked = _dense_ranking(st, collection, vec, range_for_sampling[1])
            neg = sample_negatives(
                ranked, query=u.query.text, positive_docs=pos_docs, positive_texts=pos_texts,
                negative_number=negative_number, range_for_sampling=range_for_sampling, rng=rng,
            )  # fmt: skip
            if len(neg) < negative_number:
                before = len(neg)
                neg = fill_negatives(
                    neg, coll.chunks, query=u.query.text, positive_docs=pos_docs, positive_texts=pos_texts,
                    negative_number=negative_number, rng=rng,
                )  # fmt: skip
                filled += len(neg) - before
            lines.append({**u.query.extra, "query": u.query.text, "pos": list(u.texts), "neg": neg})
            bar.update(1)
    finally:
        bar.close()
    if reranker is not None:
        add_teacher_scores(lines, reranker)

    write_train(out, lines)
    write_holdout(out, [(u.query.id, u.query.text, u.docs) for i, u in enumerate(usable) if i in held])
    report = MineReport(
        collection=collection,
        model=model_id,
        queries=str(queries),
        out_dir=out,
        settings={
            "negative_number": negative_number,
            "range_for_sampling": tuple(range_for_sampling),
            "seed": seed,
            "holdout": holdout,
            "split": split,
        },  # fmt: skip
        read=len(query_set),
        mined=len(lines),
        held_out=len(held),
        skipped={reason: ids for reason, ids in skipped.items() if ids},
        positives_missing=missing,
        negatives=sum(len(line["neg"]) for line in lines),
        filled_at_random=filled,
        teacher=str(getattr(reranker, "model_id", teacher_reranker)) if reranker is not None else None,
    )
    write_report(out, report.to_json())  # last: the run is complete
    return report


def add_teacher_scores(lines: list[dict[str, Any]], reranker: Any) -> None:
    """`pos_scores` / `neg_scores` on every line: the reranker's logits of (query, passage), every pair
    scored in one call in line, pos, neg order, as FlagEmbedding's add_reranker_score.py does."""
    pairs = [(line["query"], p) for line in lines for p in (*line["pos"], *line["neg"])]
    scores = reranker.compute_score(pairs) if pairs else []
    at = 0
    for line in lines:
        n_pos, n_neg = len(line["pos"]), len(line["neg"])
        line["pos_scores"] = [float(s) for s in scores[at : at + n_pos]]
        line["neg_scores"] = [float(s) for s in scores[at + n_pos : at + n_pos + n_neg]]
        at += n_pos + n_neg


def _encode(encoder: Any, texts: list[str], batch_size: int) -> np.ndarray:
    """Dense query vectors (hn_mine: `encode_queries`, the dense output of an M3 model)."""
    if not texts:
        return np.zeros((0, int(encoder.hidden_size)), np.float32)
    out = encoder.encode_queries(
        texts, batch_size=batch_size, return_dense=True, return_sparse=False, return_colbert_vecs=False
    )
    return np.asarray(out["dense_vecs"], dtype=np.float32)


_NO_SPARSE = (np.zeros(0, np.int64), np.zeros(0, np.float32))


def _dense_ranking(store: BGEM3Store, collection: str, vec: np.ndarray, depth: int) -> list[Chunk]:
    """The collection's first `depth` chunks for a dense query vector, best first, searched exactly."""
    spec = QuerySpec(
        mode="dense", limit=depth, prefetch_limit=depth, dense=vec, sparse=_NO_SPARSE,
        colbert=np.zeros((0, len(vec)), np.float32), exact=True,
    )  # fmt: skip
    return [
        Chunk(str(p.payload.get(DOC_ID, p.id)), str(p.payload.get(TEXT, "")))
        for p in store.query(collection, spec)
    ]


def _progress(total: int, show: bool | None) -> Any:
    from tqdm.auto import tqdm

    enabled = show if show is not None else sys.stderr.isatty()
    return tqdm(total=total, unit="query", desc="mine", disable=not enabled, dynamic_ncols=True)
