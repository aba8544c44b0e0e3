"""Expected failures of `bgem3-qdrant` and `bgem3` are one line, exit 1, never "this is a bug": broken files,
bad store paths, bad filters, damaged store files. Each runs the command as a user does (a fresh process)
and checks that nothing stored was lost."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from bgem3_qdrant import BGEM3QdrantError, StoreUnavailableError
from bgem3_qdrant.stores import layout

from tests.support import (
    assert_clean_failure,
    bound_by_file_modes,
    clone_pip_install,
    run_module,
    without_modules,
)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    """A store with collection 'kb' of a small JSONL corpus (metadata lang)."""
    root = tmp_path_factory.mktemp("failures")
    corpus = root / "docs.jsonl"
    corpus.write_text(
        "\n".join(
            json.dumps({"id": f"d{i}", "text": t, "lang": lang})
            for i, (t, lang) in enumerate(
                [("Feed the sourdough starter daily.", "en"), ("Le vélo à Paris en hiver.", "fr")]
            )
        )
        + "\n",
        encoding="utf-8",
    )
    store = root / "store"
    model = ("--model", str(tiny_checkpoint))
    done = run_module("bgem3_qdrant", "ingest", str(corpus), "-c", "kb", "--path", str(store), *model)
    assert done.returncode == 0, done.stderr
    return store


def _search(store: Path, model: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_module(
        "bgem3_qdrant", "search", "sourdough", "-c", "kb", "--path", str(store), "--model", str(model), *extra
    )


def _still_searchable(store: Path, model: Path) -> None:
    done = _search(store, model, "--json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["hits"]) == 2


def test_truncated_checkpoint_is_a_file_error(tmp_path: Path, tiny_checkpoint: Path, ingested: Path) -> None:
    broken = Path(shutil.copytree(tiny_checkpoint, tmp_path / "broken"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    done = run_module("bgem3_qdrant", "search", "q", "-c", "kb",
                      "--path", str(ingested), "--model", str(broken))
    assert_clean_failure(done, 1, "model.safetensors")
    assert "this is a bug" not in done.stderr and "unexpected" not in done.stderr
    core = run_module("bgem3_embeddings.cli", "encode", "hello", "--model", str(broken))
    assert_clean_failure(core, 1, "model.safetensors")
    assert "--help" not in core.stderr  # a broken file, not a usage error
    _still_searchable(ingested, tiny_checkpoint)


def test_store_path_below_a_file(tmp_path: Path, tiny_checkpoint: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    model = ("--model", str(tiny_checkpoint))
    done = run_module("bgem3_qdrant", "ingest", str(f), "-c", "kb", "--path", str(f / "sub"), *model)
    assert_clean_failure(done, 1, "cannot create the store folder", "--path")


@pytest.mark.parametrize(
    ("flt", "phrase"),
    [
        ('lang=["fr",1]', "a list of strings or of integers"),
        ("lang=[fr", "not valid JSON"),
        ("lang", "key=value"),
    ],
)
def test_bad_filters(flt: str, phrase: str, tiny_checkpoint: Path, ingested: Path) -> None:
    assert_clean_failure(_search(ingested, tiny_checkpoint, "--filter", flt), 1, phrase, "--filter")


def test_filter_values_that_work(tiny_checkpoint: Path, ingested: Path) -> None:
    done = _search(ingested, tiny_checkpoint, "--json", "--filter", 'lang=["fr"]')
    assert done.returncode == 0, done.stderr
    assert [h["doc_id"] for h in json.loads(done.stdout)["hits"]] == ["d1"]


@pytest.mark.parametrize("damaged", ["schema.json", "shard/edge_config.json", "segment.json"])
def test_damaged_store_files(damaged: str, tmp_path: Path, tiny_checkpoint: Path, ingested: Path) -> None:
    store = Path(shutil.copytree(ingested, tmp_path / "store"))
    coll = store / "collections" / "kb"
    target = next(coll.rglob("segment.json")) if damaged == "segment.json" else coll / damaged
    target.write_text("{not json", encoding="utf-8")
    done = _search(store, tiny_checkpoint)
    assert_clean_failure(done, 1, "kb", "damaged")
    assert "this is a bug" not in done.stderr
    _still_searchable(ingested, tiny_checkpoint)  # the original is untouched


def test_read_only_store_is_one_line(ingested: Path, tmp_path: Path, tiny_checkpoint: Path) -> None:
    """`search` on a store the user cannot write (the embedded engine writes even to search): one line that
    says so, exit 1, and the store as it was. Run under file permissions as a user is (root ignores them:
    tests/support.bound_by_file_modes)."""
    store = tmp_path / "ro"
    shutil.copytree(ingested, store)
    files = sorted(f for f in store.rglob("*") if f.is_file())
    before = {f: f.read_bytes() for f in files}
    for f in [store, *store.rglob("*")]:
        f.chmod(f.stat().st_mode & ~0o222)
    try:
        done = run_module("bgem3_qdrant", "search", "sourdough", "-c", "kb", "--path", str(store),
                          "--model", str(tiny_checkpoint), prefix=bound_by_file_modes())  # fmt: skip
    finally:
        for f in [store, *store.rglob("*")]:
            f.chmod(f.stat().st_mode | 0o200)
    assert_clean_failure(done, 1, f"the store at {store} is read-only for this user", "--path")
    assert sorted(f for f in store.rglob("*") if f.is_file()) == files
    assert all(f.read_bytes() == data for f, data in before.items())


def test_lock_store_names_a_permission_error_as_a_read_only_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lock_store's own mapping, whatever the user: a PermissionError opening the lock file (simulated)
    becomes StoreUnavailableError, a BGEM3QdrantError, which the command prints as one line."""
    store = tmp_path / "ro"
    store.mkdir()

    def refuse(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(layout, "open", refuse, raising=False)
    with pytest.raises(StoreUnavailableError, match="read-only for this user") as err:
        layout.lock_store(store)
    assert isinstance(err.value, BGEM3QdrantError)


def test_ingest_names_every_missing_input_before_anything_loads(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = run_module("bgem3_qdrant", "ingest", str(tmp_path), str(tmp_path / "notes.md"),
                      str(tmp_path / "faq.jsonl"), "-c", "kb", "--path", str(store),
                      "--model", str(tmp_path / "no-model"))  # fmt: skip
    phrases = ("no such file or directory:", "notes.md, ", "faq.jsonl (PATHS)", "no-model does not exist")
    assert_clean_failure(done, 1, *phrases)
    assert not store.exists()  # nothing was created either


def test_missing_extras_are_one_line_with_the_install_command(
    tmp_path: Path, tiny_checkpoint: Path
) -> None:
    env = without_modules(tmp_path / "stubs", "pytrec_eval", "ray")
    where = ("-c", "kb", "--path", str(tmp_path / "s"))
    done = run_module("bgem3_qdrant", "eval", str(tmp_path), *where, env=env)
    assert_clean_failure(done, 1, "needs pytrec_eval (the eval extra), not installed",
                         clone_pip_install("integrations/qdrant", "eval"))  # fmt: skip
    assert "this is a bug" not in done.stderr
    store = tmp_path / "ray-store"
    ray = run_module("bgem3_qdrant", "ingest", str(tmp_path), "-c", "kb", "--path", str(store),
                     "--engine", "ray", "--model", str(tiny_checkpoint), env=env)  # fmt: skip
    ray_hint = clone_pip_install("integrations/qdrant", "ray")
    assert_clean_failure(ray, 1, "the Ray engine needs Ray Data", ray_hint)
    assert "this is a bug" not in ray.stderr and not store.exists()
