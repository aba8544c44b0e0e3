"""`bgem3-qdrant mine`: hard negatives from a collection as FlagEmbedding's hn_mine picks them.

- the choice itself (ranks start..end-1 of the distinct texts, positives and the query's text out, a seeded
  `random.sample`, hn_mine's random fill-up), on constructed rankings;
- on a collection of the tiny model: every negative lies in the range of the exact dense ranking (computed
  here from the stored vectors), never a chunk of a positive document; the count; the same seed gives
  the same file; held-out queries are never searched and their folder is what eval reads (no corpus);
- the file reads in `bgem3 finetune`'s reader; teacher scores are BGEM3Reranker's scores of those pairs;
- FlagEmbedding JSONL positives matched to stored chunk texts; each bad input one line, the store as it was.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target
from bgem3_qdrant.cli import app
from bgem3_qdrant.errors import BGEM3QdrantError
from bgem3_qdrant.evaluation import EvalOptions, evaluate, load_beir
from bgem3_qdrant.payload import DOC_ID, TEXT
from bgem3_qdrant.tuning.mine import Chunk, fill_negatives, mine_collection, sample_negatives

from bgem3_embeddings.cli_support import run_cli
from bgem3_embeddings.finetune.data import read_training_data

TOPICS = ["sourdough", "bicycle", "volcano", "espresso", "windpower", "library", "glacier", "orchestra"]
WORDS = [
    "river",
    "stone",
    "market",
    "garden",
    "window",
    "harbour",
    "lantern",
    "meadow",
    "copper",
    "engine",
    "signal",
    "ladder",
]
N_DOCS = 32
LONG_TOPICS = ["harbour lanterns", "copper engines", "meadow signals", "river ladders"]
LONG = " ".join(
    f"Part {i}: the {topic} " + " ".join(random.Random(100 + i).choice(WORDS) for _ in range(40)) + "."
    for i, topic in enumerate(LONG_TOPICS)
)
COLLECTION = "kb"
RANGE = (2, 30)  # of the 45 distinct chunk texts: the long document's chunks come within it


def _doc(i: int) -> str:
    rnd = random.Random(i)
    return f"{TOPICS[i % len(TOPICS)]} note {i}: " + " ".join(rnd.choice(WORDS) for _ in range(8)) + "."


def write_dataset(root: Path) -> Path:
    """A BEIR folder: N_DOCS one-chunk documents (two with the same text) and 12 judged queries."""
    (root / "qrels").mkdir(parents=True)
    docs = {f"d{i}": _doc(i) for i in range(N_DOCS)}
    docs["d31"] = docs["d30"]  # two documents of one text: one entry of the ranking (hn_mine's set)
    docs["dlong"] = LONG  # several chunks: its best one for the query is the positive, none a negative
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for did, text in docs.items():
            f.write(json.dumps({"_id": did, "title": "", "text": text}) + "\n")
    queries = {f"q{i}": f"what about {TOPICS[i % len(TOPICS)]} {i}?" for i in range(12)}
    queries.update({f"ql{i}": f"tell me about {topic}" for i, topic in enumerate(LONG_TOPICS)})
    queries["q-gone"] = "a query whose document was never ingested"
    with (root / "queries.jsonl").open("w", encoding="utf-8") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    rows = [(f"q{i}", f"d{i}", 1) for i in range(12)] + [("q1", "d9", 2), ("q-gone", "d999", 1)]
    rows += [(f"ql{i}", "dlong", 1) for i in range(len(LONG_TOPICS))]
    lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{g}" for q, d, g in rows)]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("mine") / "data")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory, dataset: Path, encoder: Any) -> Path:
    path = tmp_path_factory.mktemp("mine_store") / "store"
    with open_store(resolve_target(path=str(path))) as st:
        opts = IngestOptions(chunk_size=64, chunk_overlap=8, show_progress=False)
        Ingestor(st, COLLECTION, encoder, options=opts).ingest_paths([dataset / "corpus.jsonl"])
    return path


def _open(path: Path) -> Any:
    return open_store(resolve_target(path=str(path)))


def _stored(path: Path) -> list[tuple[str, str, np.ndarray]]:
    """(doc id, text, dense vector) of every stored chunk."""
    with _open(path) as st:
        name = st.stored_schema(COLLECTION).dense_name
        return [
            (p.payload[DOC_ID], p.payload[TEXT], np.asarray(p.vectors[name], np.float32))
            for p in st.iter_points(COLLECTION, with_payload=[DOC_ID, TEXT], with_vectors=[name])
        ]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        run_cli(app, expected=(BGEM3QdrantError,), argv=list(args), start_tensorflow=False)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


# ---------------------------------------------------------------------------------------- the choice
def _ranking() -> list[Chunk]:
    # rank: 0 pos-doc chunk, 1 t1, 2 t1 again (same text), 3 the query's text, 4 pos text, 5.. t5..t14
    return [Chunk("P", "p chunk"), Chunk("a", "t1"), Chunk("b", "t1"), Chunk("c", "the query"),
            Chunk("d", "pos text"), *(Chunk(f"x{i}", f"t{i}") for i in range(5, 15))]  # fmt: skip


def _sample(n: int, rng_seed: int, window: tuple[int, int] = (1, 12)) -> list[str]:
    return sample_negatives(
        _ranking(), query="the query", positive_docs={"P"}, positive_texts={"pos text"},
        negative_number=n, range_for_sampling=window, rng=random.Random(rng_seed),
    )  # fmt: skip


def test_sampling_takes_hn_mines_ranks_without_positives() -> None:
    # Distinct texts: p chunk, t1, the query, pos text, t5..t14 -> ranks 1..11 = t1, query, pos, t5..t12
    everything = _sample(50, 0)
    assert everything == ["t1", *(f"t{i}" for i in range(5, 13))]  # all of them, in rank order
    picked = _sample(4, 3)
    assert len(picked) == 4 and set(picked) <= set(everything)
    assert picked == random.Random(3).sample(everything, 4)  # hn_mine's draw: random.sample
    assert picked == _sample(4, 3) and picked != _sample(4, 4)  # the seed decides
    assert _sample(50, 0, (0, 2)) == ["t1"]  # rank 0 is a positive's chunk; END is excluded


def test_fill_up_draws_from_the_whole_collection_never_a_positive() -> None:
    corpus = [*_ranking(), Chunk("P", "p other chunk")]
    got = fill_negatives(["t1"], corpus, query="the query", positive_docs={"P"}, positive_texts={"pos text"},
                         negative_number=6, rng=random.Random(0))  # fmt: skip
    assert got[0] == "t1" and len(got) == 6 and len(set(got)) == 6
    assert not {"p chunk", "p other chunk", "pos text", "the query"} & set(got)
    few = fill_negatives([], corpus[:5], query="the query", positive_docs={"P"}, positive_texts={"pos text"},
                         negative_number=6, rng=random.Random(0))  # fmt: skip
    assert few == ["t1"]  # as many as there are


# ----------------------------------------------------------------------------- on a real collection
@pytest.fixture(scope="module")
def mined(tmp_path_factory: pytest.TempPathFactory, dataset: Path, store_path: Path, encoder: Any) -> dict:
    """One mining run (3 negatives from ranks 2-30, a quarter held out), every search recorded."""
    out = tmp_path_factory.mktemp("mined") / "out"
    searched: list[np.ndarray] = []
    with _open(store_path) as st:
        query = st.query

        def recording(name: str, spec: Any) -> Any:
            searched.append(np.asarray(spec.dense))
            return query(name, spec)

        st.query = recording
        report = mine_collection(st, COLLECTION, dataset, out, negative_number=3, range_for_sampling=RANGE,
                                 holdout=0.25, seed=7, encoder=encoder, show_progress=False)  # fmt: skip
    return {"out": out, "report": report, "searched": searched}


def test_negatives_come_from_the_ranks_of_the_exact_dense_ranking(
    mined: dict, store_path: Path, encoder: Any
) -> None:
    lines = _lines(mined["out"] / "train.jsonl")
    assert len(lines) == mined["report"].mined == 12  # 16 usable, 4 held out, q-gone skipped
    stored = _stored(store_path)
    qrels = load_beir(_data_dir(mined)).qrels
    by_text = {text: qid for qid, text in load_beir(_data_dir(mined)).queries.items()}
    vecs = encoder.encode_queries([line["query"] for line in lines], return_dense=True, return_sparse=False,
                                  return_colbert_vecs=False)["dense_vecs"]  # fmt: skip
    best_not_first = long_in_window = 0
    for line, vec in zip(lines, vecs, strict=True):
        positives = {d for d, g in qrels[by_text[line["query"]]].items() if g > 0}
        scores = np.array([v @ vec for _, _, v in stored])
        distinct: list[str] = []
        for i in np.argsort(-scores, kind="stable"):
            if stored[i][1] not in distinct:
                distinct.append(stored[i][1])
        window = distinct[RANGE[0] : RANGE[1]]
        assert len(line["neg"]) == 3 and len(set(line["neg"])) == 3
        pos_chunks = {t for d, t, _ in stored if d in positives}  # every chunk of a positive document
        for neg in line["neg"]:
            assert neg in window, (line["query"], neg)  # within ranks 2..29
            assert neg not in pos_chunks
        # Each positive document is written as its chunk with the best dense score for the query.
        best = {d: max((s, t) for (dd, t, _), s in zip(stored, scores, strict=True) if dd == d)[1]
                for d in positives}  # fmt: skip
        assert line["pos"] == [best[d] for d in qrels[by_text[line["query"]]] if d in positives]
        assert "pos_scores" not in line
        if "dlong" in positives:
            long_chunks = [t for d, t, _ in stored if d == "dlong"]
            assert len(long_chunks) > 2
            best_not_first += best["dlong"] != min(long_chunks, key=LONG.index)
            long_in_window += any(t in window for t in long_chunks)
    # What the assertions above rest on: the long document's best chunk is not always its first, and its
    # chunks come within the range (so leaving them out of the negatives is checked).
    assert best_not_first and long_in_window


def _data_dir(mined: dict) -> Path:
    return Path(mined["report"].queries)


def test_the_same_seed_gives_the_same_file(
    tmp_path: Path, mined: dict, store_path: Path, encoder: Any
) -> None:
    with _open(store_path) as st:
        for name, seed in (("same", 7), ("other", 8)):
            mine_collection(st, COLLECTION, _data_dir(mined), tmp_path / name, negative_number=3,
                            range_for_sampling=RANGE, holdout=0.25, seed=seed, encoder=encoder,
                            show_progress=False)  # fmt: skip
    first = (mined["out"] / "train.jsonl").read_text()
    assert (tmp_path / "same" / "train.jsonl").read_text() == first
    assert (tmp_path / "same" / "holdout" / "queries.jsonl").read_text() == (
        mined["out"] / "holdout" / "queries.jsonl"
    ).read_text()
    assert (tmp_path / "other" / "train.jsonl").read_text() != first


def test_held_out_queries_are_never_mined_and_eval_reads_their_folder(
    mined: dict, store_path: Path, encoder: Any
) -> None:
    holdout = mined["out"] / "holdout"
    assert not (holdout / "corpus.jsonl").exists()
    held = load_beir(holdout)  # the folder eval reads (no corpus: the collection holds the documents)
    assert len(held.queries) == mined["report"].held_out == 4
    train_queries = {line["query"] for line in _lines(mined["out"] / "train.jsonl")}
    assert not set(held.queries.values()) & train_queries
    # Never searched: one search per mined query, none with a held-out query's vector.
    assert len(mined["searched"]) == mined["report"].mined
    held_vecs = encoder.encode_queries(list(held.queries.values()), return_dense=True, return_sparse=False,
                                       return_colbert_vecs=False)["dense_vecs"]  # fmt: skip
    for v in mined["searched"]:
        assert min(float(np.abs(v - h).max()) for h in held_vecs) > 1e-4
    source = load_beir(_data_dir(mined)).qrels
    for qid, docs in held.qrels.items():
        assert docs == source[qid]  # their judged positives, as judged
    with _open(store_path) as st:
        report = evaluate(st, [COLLECTION], encoder, holdout,
                          options=EvalOptions(modes=("dense",), show_progress=False))  # fmt: skip
    assert report.queries == 4 and not report.warnings


def test_the_file_is_what_finetune_reads(mined: dict) -> None:
    data = read_training_data(mined["out"] / "train.jsonl", train_group_size=4)
    assert len(data) == mined["report"].mined and not data.skipped
    assert all(len(e.neg) == 3 for e in data.examples)
    summary = json.loads((mined["out"] / "mine.json").read_text())
    assert summary["mined"] == 12 and summary["skipped"] == {
        "whose positives are not in the collection": ["q-gone"]
    }
    line = mined["report"].format()
    assert "skipped 1 whose positives are not in the collection (q-gone)" in line, line


def test_teacher_scores_are_the_rerankers(
    tmp_path: Path, mined: dict, store_path: Path, encoder: Any, tiny_reranker_checkpoint: Path
) -> None:
    from bgem3_embeddings import BGEM3Reranker

    reranker = BGEM3Reranker(str(tiny_reranker_checkpoint))
    with _open(store_path) as st:
        mine_collection(st, COLLECTION, _data_dir(mined), tmp_path / "kd", negative_number=3,
                        range_for_sampling=RANGE, seed=7, encoder=encoder, teacher_reranker=reranker,
                        show_progress=False)  # fmt: skip
    lines = _lines(tmp_path / "kd" / "train.jsonl")
    for line in lines:
        expected = reranker.compute_score([(line["query"], p) for p in line["pos"] + line["neg"]])
        got = line["pos_scores"] + line["neg_scores"]
        assert len(line["pos_scores"]) == len(line["pos"]) and len(line["neg_scores"]) == len(line["neg"])
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert len({s for line in lines for s in line["neg_scores"]}) > 1  # real scores, not a constant
    data = read_training_data(
        tmp_path / "kd" / "train.jsonl", knowledge_distillation=True, train_group_size=4
    )
    assert data.examples[0].neg_scores is not None


def test_flagembedding_jsonl_positives_are_matched_by_text(
    tmp_path: Path, store_path: Path, encoder: Any
) -> None:
    stored = _stored(store_path)
    texts = {d: t for d, t, _ in stored}
    lines = [
        {
            "query": "sourdough again",
            "pos": [texts["d0"]],
            "neg": ["stale"],
            "neg_scores": [1.0],
            "prompt": "Q: ",
        },
        {"query": "nothing stored", "pos": ["a passage the collection does not hold"]},
        {"query": "   ", "pos": [texts["d2"]]},
        {"query": "two of them", "pos": [texts["d3"], "not stored either"]},
    ]
    src = tmp_path / "train_in.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    with _open(store_path) as st:
        report = mine_collection(st, COLLECTION, src, tmp_path / "out", negative_number=2,
                                 range_for_sampling=(1, 8), encoder=encoder, show_progress=False)  # fmt: skip
    out = _lines(tmp_path / "out" / "train.jsonl")
    assert [x["query"] for x in out] == ["sourdough again", "two of them"]
    assert out[0]["pos"] == [texts["d0"]] and out[0]["prompt"] == "Q: " and "neg_scores" not in out[0]
    assert out[0]["neg"] != ["stale"] and texts["d0"] not in out[0]["neg"] and len(out[0]["neg"]) == 2
    assert out[1]["pos"] == [texts["d3"]]  # the one the collection holds
    assert report.skipped == {
        "with an empty text": ["line3"],
        "whose positives are not in the collection": ["line2"],
    }
    assert report.positives_missing == 2


# ------------------------------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_seed1"), seed=1)


def _snapshot(path: Path) -> list[tuple[str, dict]]:
    with _open(path) as st:
        points = sorted((p.id, p.payload) for p in st.iter_points(COLLECTION))
        return [*points, ("record", st.read_model_record(COLLECTION) or {})]


def test_bad_input_is_one_line_and_the_store_is_untouched(
    tmp_path: Path,
    dataset: Path,
    store_path: Path,
    tiny_checkpoint: Path,
    other_checkpoint: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = _snapshot(store_path)
    common = ("-c", COLLECTION, "--path", str(store_path), "--no-progress")

    def refused(*args: str) -> str:
        code, out, err = cli(capsys, "mine", *args, *common)
        assert code == 1 and not out, (out, err)
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        return lines[0]

    gone = tmp_path / "gone"
    write_dataset(gone)
    (gone / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tnowhere\t1\nq2\tneither\t1\n")
    line = refused(str(gone), "--output", str(tmp_path / "o1"), "--model", str(tiny_checkpoint))
    assert f"none of the 2 queries in {gone} can be mined from collection '{COLLECTION}'" in line
    assert "2 whose positives are not in the collection; mine the collection" in line

    line = refused(str(dataset), "--output", str(tmp_path / "o2"), "--model", str(other_checkpoint))
    assert "holds vectors of another model (--model)" in line and str(other_checkpoint) in line

    existing = tmp_path / "o3"
    code, out, err = cli(capsys, "mine", str(dataset), "--output", str(existing), *common)
    assert code == 0, err
    assert (
        "mined 16 of 17 queries" in out
        and "skipped 1 whose positives are not in the collection (q-gone)" in out
    )
    first = (existing / "train.jsonl").read_text()
    line = refused(str(dataset), "--output", str(existing), "--seed", "5")
    assert "already holds mined data (train.jsonl, mine.json) (--output)" in line and "--overwrite" in line
    assert (existing / "train.jsonl").read_text() == first  # nothing replaced
    code, _, err = cli(capsys, "mine", str(dataset), "--output", str(existing), "--seed", "5", "--overwrite",
                       *common)  # fmt: skip
    assert code == 0, err

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    line = refused(str(empty), "--output", str(tmp_path / "o4"))
    assert "holds no query (QUERIES)" in line
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"query": " ", "pos": ["x"]}) + "\n")
    line = refused(str(blank), "--output", str(tmp_path / "o5"))
    assert "none of the 1 query in" in line and "1 with an empty text" in line

    line = refused(str(dataset), "--output", str(tmp_path / "o6"), "--range-for-sampling", "20-5")
    assert "--range-for-sampling 20-5" in line
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    assert _snapshot(store_path) == before


def test_a_positive_whose_id_holds_whitespace_is_never_held_out(tmp_path: Path, encoder: Any) -> None:
    """qrels fields are split on whitespace: such a query stays in training, the holdout stays readable."""
    records = [{"id": "notes/my file.md", "text": "a note kept in a file whose name has a space"}]
    records += [{"id": f"doc-{i}", "text": f"{TOPICS[i]} plain record {i}"} for i in range(len(TOPICS))]
    corpus = tmp_path / "records.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps({"query": f"about {r['text']}", "pos": [r["text"]]}) + "\n"
                               for r in records), encoding="utf-8")  # fmt: skip
    with _open(tmp_path / "store") as st:
        Ingestor(st, "notes", encoder, options=IngestOptions(show_progress=False)).ingest_paths([corpus])
        for seed in range(8):  # at 50%, some seed would draw it were it eligible
            out = tmp_path / f"o{seed}"
            report = mine_collection(st, "notes", queries, out, negative_number=2, holdout=0.5, seed=seed,
                                     encoder=encoder, show_progress=False)  # fmt: skip
            held = load_beir(out / "holdout")
            assert report.held_out == len(held.queries) == 4
            assert "line1" not in held.queries
            assert any(line["pos"] == [records[0]["text"]] for line in _lines(report.train_file))
