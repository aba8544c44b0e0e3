"""Missing optional packages raise an ImportError that names the pip install to run."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

from tests.install_forms import clone_pip_install

EXTRA = clone_pip_install("integrations/langchain", "qdrant")


@pytest.mark.parametrize(
    ("blocked", "module", "attr", "hint"),
    [
        ("langchain_qdrant", "langchain_bgem3.sparse", "BGEM3SparseEmbeddings", EXTRA),
        ("langchain_qdrant", "langchain_bgem3.retriever", "BGEM3Retriever", EXTRA),
        ("qdrant_client", "langchain_bgem3.retriever", "BGEM3Retriever", EXTRA),
        ("bgem3_qdrant", "langchain_bgem3.retriever", "BGEM3Retriever", EXTRA),
    ],
)
def test_missing_extra_names_the_pip_install(
    monkeypatch: pytest.MonkeyPatch, blocked: str, module: str, attr: str, hint: str
) -> None:
    import langchain_bgem3

    if blocked != "langchain_qdrant":  # loaded first, whatever ran before: the import that fails is blocked's
        importlib.import_module("langchain_qdrant")
    # A None entry in sys.modules makes `import blocked` raise ImportError, as if it were not installed.
    monkeypatch.setitem(sys.modules, blocked, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError, match=r"pip install") as info:
        getattr(langchain_bgem3, attr)
    assert hint in str(info.value)
    assert blocked in str(info.value)


def test_core_import_does_not_need_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_qdrant", None)
    for name in [m for m in sys.modules if m.startswith("langchain_bgem3")]:
        monkeypatch.delitem(sys.modules, name)
    mod = importlib.import_module("langchain_bgem3")
    assert mod.BGEM3Embeddings.__name__ == "BGEM3Embeddings"


def test_missing_core_names_the_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from langchain_bgem3._encoder import load_encoder

    monkeypatch.setitem(sys.modules, "bgem3_embeddings", None)
    with pytest.raises(ImportError, match=re.escape(clone_pip_install("."))):
        load_encoder("some/unseen-model", None, {"device": "cpu"})
