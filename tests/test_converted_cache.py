"""The converted-weights cache: a second load maps the ported weights, outputs still match the reference."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings import loading
from bgem3_embeddings.batching import pad_batch
from bgem3_embeddings.checkpoint import converted
from tests.reference_m3 import ReferenceM3, assert_batch_matches_reference

TEXTS = ["What is BGE M3?", "BM25 is a bag-of-words retrieval function", "a"]
ALL = ("dense_vecs", "sparse_weights", "colbert_vecs")


@pytest.fixture()
def checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """A private copy: these tests change file times."""
    return Path(shutil.copytree(tiny_checkpoint, tmp_path / "ckpt"))


def _count_ports(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = loading.load_encoder_weights

    def counting(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_encoder_weights", counting)
    return calls


def _encoder(checkpoint: Path, cache: Path | bool) -> Any:
    from bgem3_embeddings import BGEM3Encoder

    return BGEM3Encoder(checkpoint, precision="float32", device="cpu", weights_cache=cache)


def _check_against_reference(encoder: Any, checkpoint: Path) -> None:
    """Eagerly and through the traced function: the table lookups differ with how the weights were loaded."""
    ids, mask = pad_batch(encoder.tokenize(TEXTS, 64), encoder.tokenizer.pad_token_id)
    real = [list(row[m.astype(bool)]) for row, m in zip(ids, mask, strict=True)]
    ref = ReferenceM3(checkpoint).encode_ids(real)
    for eager in (True, False):
        encoder.eager_max_tokens, encoder.eager_batches_left = ids.size, int(eager)
        assert_batch_matches_reference(encoder.run_batch(ids, mask, ALL), ids, mask, ref)
        assert encoder.trace_count() == int(not eager)


def test_second_load_maps_the_cache_and_matches_the_reference(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = _count_ports(monkeypatch)
    cache = tmp_path / "cache"
    _encoder(checkpoint, cache)
    files = list(cache.glob("*.safetensors"))
    assert len(ports) == 1 and len(files) == 1
    encoder = _encoder(checkpoint, cache)
    assert len(ports) == 1, "the second load ported the checkpoint again instead of mapping the cache"
    # Mapped tables are read whole (shared with the file), never gathered from the variable (a copy).
    assert encoder.model.embeddings.gather_from_variables is False
    _check_against_reference(encoder, checkpoint)
    assert not list(cache.glob("*.tmp")), "a temporary file was left behind"


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux-only")
def test_a_mapped_load_prefetches_every_tensor_but_the_word_table(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    _encoder(checkpoint, cache)  # ports and writes the cache
    advised: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "posix_fadvise", lambda _fd, start, size, how: advised.append((start, size, how)))
    encoder = _encoder(checkpoint, cache)
    with converted.SafetensorsFile(next(cache.glob("*.safetensors"))) as file:
        spans = {}
        for name in file.infos():
            shape, stored, offset = file.layout(name)
            spans[name] = (offset, int(np.prod(shape, dtype=np.int64)) * stored.itemsize)
    assert converted.WORD_TABLE in spans
    assert {(offset, size) for offset, size, _ in advised} == {
        span for name, span in spans.items() if name != converted.WORD_TABLE and span[1] > 0
    }
    assert {advice for _, _, advice in advised} == {os.POSIX_FADV_WILLNEED}
    _check_against_reference(encoder, checkpoint)  # advice changes no value


def test_a_changed_checkpoint_invalidates_the_cache(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = _count_ports(monkeypatch)
    cache = tmp_path / "cache"
    _encoder(checkpoint, cache)
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    encoder = _encoder(checkpoint, cache)
    assert len(ports) == 2, "a modified checkpoint was served from the stale cache"
    _encoder(checkpoint, cache)
    assert len(ports) == 2, "the rewritten cache was not used"
    _check_against_reference(encoder, checkpoint)


def test_a_corrupt_or_misshapen_cache_is_ignored_and_rewritten(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = _count_ports(monkeypatch)
    cache = tmp_path / "cache"
    encoder = _encoder(checkpoint, cache)
    (path,) = cache.glob("*.safetensors")
    # Right fingerprint, wrong shape for one variable: refused by the shape check.
    tensors: dict[str, Any] = {v.path: v.numpy() for v in encoder.model.variables}
    name = encoder.model.colbert_linear.bias.path
    tensors[name] = np.zeros(tensors[name].shape[0] + 1, np.float32)
    converted.write_converted(path, tensors, converted.fingerprint(encoder.files, "float32"))
    _check_against_reference(_encoder(checkpoint, cache), checkpoint)
    assert len(ports) == 2
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    _check_against_reference(_encoder(checkpoint, cache), checkpoint)
    assert len(ports) == 3
    _encoder(checkpoint, cache)
    assert len(ports) == 3


def test_cache_off(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(converted.ENV_VAR, "off")
    assert converted.resolve_cache_dir(True) is None
    ports = _count_ports(monkeypatch)
    _encoder(checkpoint, True)
    ported = _encoder(checkpoint, False)
    assert len(ports) == 2
    # Ported tables were written in row blocks: gathered straight from the variables (no copy there).
    assert ported.model.embeddings.gather_from_variables is True
    _check_against_reference(ported, checkpoint)
