"""Ray Data engine on a local Ray instance: same point ids and vectors as the plain engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import IngestOptions, Ingestor
from bgem3_qdrant.client import open_client, resolve_target
from bgem3_qdrant.stores import BGEM3Store

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    # Light on purpose: 2 CPUs, a small object store, no dashboard.
    ray.init(
        num_cpus=2,
        object_store_memory=200 * 1024**2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}},
    )
    yield ray
    ray.shutdown()


def _vectors(client: BGEM3Store) -> dict[str, Any]:
    return {r.id: r for r in client.iter_points("docs", with_vectors=True)}


def test_ray_engine_matches_plain(
    local_ray: Any, tmp_path: Path, tiny_checkpoint: Path, encoder: Any, corpus: Path
) -> None:
    opts = {"chunk_size": 24, "chunk_overlap": 4, "batch_size": 8, "show_progress": False}
    model = str(tiny_checkpoint)
    plain = open_client(resolve_target(path=str(tmp_path / "plain")))
    viaray = open_client(resolve_target(path=str(tmp_path / "ray")))
    try:
        s1 = Ingestor(plain, "docs", encoder, options=IngestOptions(**opts), model_id=model).ingest_paths(
            [corpus]
        )
        from bgem3_qdrant.ray_engine import driver_tokenizer_encoder

        info = driver_tokenizer_encoder(model)
        assert info.hidden_size == encoder.hidden_size
        ing = Ingestor(viaray, "docs", info, options=IngestOptions(**opts), model_id=model)
        s2 = ing.ingest_paths([corpus], engine="ray", concurrency=1)
        assert s2.encoded == s1.encoded == s2.chunks and s2.tokens == s1.tokens
        a, b = _vectors(plain), _vectors(viaray)
        assert a.keys() == b.keys()
        for pid, ra in a.items():
            rb = b[pid]
            assert ra.payload == rb.payload
            np.testing.assert_allclose(ra.vectors["dense"], rb.vectors["dense"], atol=1e-5)
            # ColBERT is stored in float16: float32 results a few ulps apart (a batch run eagerly in one
            # process and traced in the other) may round to neighbouring float16 values, 2^-11 apart.
            np.testing.assert_allclose(ra.vectors["colbert"], rb.vectors["colbert"], rtol=2**-10, atol=1e-5)
            np.testing.assert_array_equal(ra.vectors["sparse"][0], rb.vectors["sparse"][0])
            np.testing.assert_allclose(ra.vectors["sparse"][1], rb.vectors["sparse"][1], atol=1e-5)
        # A re-run through Ray finds everything stored and starts no encoding.
        s3 = ing.ingest_paths([corpus], engine="ray", concurrency=1)
        assert s3.encoded == 0 and s3.unchanged == s3.chunks
    finally:
        plain.close()
        viaray.close()
    assert os.environ.get("RAY_ADDRESS") is None or True
