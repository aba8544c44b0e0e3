"""BGEM3Tokenizer (tokenizers only) against the reference, transformers' AutoTokenizer, on the tiny model."""

from __future__ import annotations

import copy
import logging
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from bgem3_embeddings.tokenizer import BGEM3Tokenizer
from tests.tiny_checkpoint import SAMPLE_TEXT

LONG_TEXT = " ".join(SAMPLE_TEXT * 25)  # over 8192 tokens, so even max_length=8192 truncates it
TEXTS = [
    "What is BGE M3?",
    "Le garçon a mangé une crème brûlée à côté de l'église où Zoë habitait, naïvement.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "敏捷的棕色狐狸跳过了懒狗。素早い茶色の狐。빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "Emoji 🤗 👍🏽 🇫🇷 and a family 👨‍👩‍👧 too",
    "Hello , world . It 's a test ! Isn 't it ? They 're here .",  # decode's clean-up changes this one
    "Literal special tokens: <s> x </s> <mask> <pad> <unk>",
    "Compatibility forms: ﬁ ① Ｆｕｌｌ ｗｉｄｔｈ e\u0301 a\u200bb",
    "tabs\tand\nnew lines  and   runs of    spaces",
    "  leading and trailing spaces  ",
    "",
    "   \t\n  ",
    LONG_TEXT,
]
MAX_LENGTHS = [2, 3, 8, 512, 8192]


@pytest.fixture(scope="module")
def ours(tiny_checkpoint: Path) -> BGEM3Tokenizer:
    return BGEM3Tokenizer.from_dir(tiny_checkpoint)


@pytest.fixture(scope="module")
def hf(tiny_checkpoint: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_checkpoint))


def test_the_long_text_is_long_enough(hf: Any) -> None:
    assert len(hf(LONG_TEXT)["input_ids"]) > 8192


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("max_length", [None, *MAX_LENGTHS])
def test_ids_match_transformers(
    ours: BGEM3Tokenizer, hf: Any, add_special_tokens: bool, max_length: int | None
) -> None:
    kwargs: dict[str, Any] = {"add_special_tokens": add_special_tokens, "max_length": max_length}
    # truncation=None with a max_length truncates in transformers too; check both spellings.
    for truncation in ([True, None] if max_length else [False]):
        got = ours(TEXTS, truncation=truncation, **kwargs)
        want = hf(TEXTS, truncation=truncation, **kwargs)
        assert got["input_ids"] == want["input_ids"]
        assert got["attention_mask"] == want["attention_mask"]
        for text, ids in zip(TEXTS, want["input_ids"], strict=True):
            assert ours(text, truncation=truncation, **kwargs)["input_ids"] == ids
            assert ours.encode(text, add_special_tokens, truncation, max_length) == ids
    if max_length is not None:
        assert max(len(ids) for ids in got["input_ids"]) == max_length  # the limit was reached


@pytest.mark.parametrize("max_length", MAX_LENGTHS)
def test_encode_batch_matches_transformers(ours: BGEM3Tokenizer, hf: Any, max_length: int) -> None:
    want = hf(TEXTS, truncation=True, max_length=max_length, padding=False)["input_ids"]
    got = ours.encode_batch(TEXTS, max_length)
    assert got == want
    assert all(ids[0] == ours.cls_token_id and ids[-1] == ours.eos_token_id for ids in got)


def test_truncation_without_max_length_uses_model_max_length(ours: BGEM3Tokenizer, hf: Any) -> None:
    got = ours(LONG_TEXT, truncation=True)["input_ids"]
    assert got == hf(LONG_TEXT, truncation=True)["input_ids"]
    assert len(got) == ours.model_max_length == 8192
    assert len(ours(LONG_TEXT)["input_ids"]) > 8192  # no truncation unless asked


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_offsets_match_transformers(ours: BGEM3Tokenizer, hf: Any, add_special_tokens: bool) -> None:
    kwargs: dict[str, Any] = {"add_special_tokens": add_special_tokens, "return_offsets_mapping": True}
    got = ours(TEXTS, **kwargs)["offset_mapping"]
    assert got == hf(TEXTS, **kwargs)["offset_mapping"]
    assert ours(TEXTS[1], **kwargs)["offset_mapping"] == hf(TEXTS[1], **kwargs)["offset_mapping"]
    assert all(isinstance(pair, tuple) for pair in got[1]) and len(got[1]) > 10
    assert "offset_mapping" not in ours(TEXTS[1])


def test_decode_and_tokens_match_transformers(ours: BGEM3Tokenizer, hf: Any) -> None:
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
            assert ours.convert_ids_to_tokens(ids, skip) == hf.convert_ids_to_tokens(ids, skip)
    ids = hf(TEXTS[7])["input_ids"]
    # The clean-up that tokenizer_config.json asks for matters here, so the comparison above means something.
    assert ours.backend_tokenizer.decode(ids) != hf.decode(ids)
    assert ours.decode(ids[3]) == hf.decode(ids[3])
    assert ours.convert_ids_to_tokens(ids[3]) == hf.convert_ids_to_tokens(ids[3])


def test_special_ids_and_sizes_match_transformers(ours: BGEM3Tokenizer, hf: Any) -> None:
    for name in ("cls", "bos", "eos", "sep", "pad", "unk", "mask"):
        assert getattr(ours, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert (ours.cls_token_id, ours.pad_token_id, ours.eos_token_id, ours.unk_token_id) == (0, 1, 2, 3)
    assert len(ours) == len(hf) > 100
    assert ours.model_max_length == hf.model_max_length
    assert ours.token_to_id("<mask>") == hf.convert_tokens_to_ids("<mask>")


def test_threads_share_one_tokenizer(ours: BGEM3Tokenizer, hf: Any) -> None:
    lengths = [2, 3, 5, 8, 16, 64, 512, 8192]
    want = {m: hf(TEXTS, truncation=True, max_length=m)["input_ids"] for m in lengths}
    start = threading.Barrier(len(lengths))

    def work(m: int) -> bool:
        start.wait()  # all threads encode at the same moment
        return all(ours.encode_batch(TEXTS, m) == want[m] for _ in range(20))

    with ThreadPoolExecutor(len(lengths)) as pool:
        assert list(pool.map(work, lengths)) == [True] * len(lengths)
    assert ours.backend_tokenizer.truncation is None
    assert ours.backend_tokenizer.padding is None


def test_constructor_leaves_the_callers_backend_alone(tiny_checkpoint: Path, hf: Any) -> None:
    backend = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    backend.enable_truncation(4)
    tok = BGEM3Tokenizer(backend, model_max_length=8192)
    assert backend.truncation is not None  # not switched off behind the caller's back
    assert tok.backend_tokenizer.truncation is None and tok.backend_tokenizer.padding is None
    assert tok(LONG_TEXT)["input_ids"] == hf(LONG_TEXT)["input_ids"]
    assert copy.deepcopy(tok.backend_tokenizer).encode("hi").ids == tok.encode("hi")


def test_folder_without_tokenizer_json_falls_back_to_transformers(
    tiny_checkpoint: Path, hf: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = ("sentencepiece.bpe.model", "tokenizer_config.json", "special_tokens_map.json", "config.json")
    for name in files:
        shutil.copy(tiny_checkpoint / name, tmp_path / name)
    with caplog.at_level(logging.INFO, logger="bgem3_embeddings.tokenizer"):
        tok = BGEM3Tokenizer.from_dir(tmp_path)
    assert "no tokenizer.json" in caplog.text
    assert tok(TEXTS, truncation=True, max_length=512)["input_ids"] == hf(
        TEXTS, truncation=True, max_length=512
    )["input_ids"]
    assert (tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, len(tok)) == (0, 2, 1, len(hf))


def test_folder_without_tokenizer_files_is_a_value_error(tiny_checkpoint: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_checkpoint / "config.json", tmp_path / "config.json")
    with pytest.raises(ValueError, match="cannot load the tokenizer from") as err:
        BGEM3Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(ValueError, match="not a directory"):
        BGEM3Tokenizer.from_dir(tmp_path / "missing")


def test_corrupt_tokenizer_json_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot load the tokenizer from") as err:
        BGEM3Tokenizer.from_dir(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_loading_imports_neither_transformers_nor_torch(tiny_checkpoint: Path) -> None:
    code = (
        "import sys\n"
        "from bgem3_embeddings.tokenizer import BGEM3Tokenizer\n"
        f"tok = BGEM3Tokenizer.from_dir({str(tiny_checkpoint)!r})\n"
        "ids = tok.encode_batch(['What is BGE M3?'], 8192)[0]\n"
        "assert ids[0] == 0 and ids[-1] == 2 and len(ids) > 3, ids\n"
        "assert tok('x', return_offsets_mapping=True)['offset_mapping']\n"
        "bad = [m for m in ('transformers', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_bad_inputs(ours: BGEM3Tokenizer) -> None:
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        ours(["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"texts\[2\] must be a str, got NoneType"):
        ours.encode_batch(["a", "b", None], 8)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got bytes"):
        ours(b"abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="texts must be a list of str, got str"):
        ours.encode_batch("abc", 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_length must be an int"):
        ours.encode_batch(["a"], 8.0)  # type: ignore[arg-type]
    for padding in (True, "longest", "max_length"):
        with pytest.raises(ValueError, match="padding is done by the encoder"):
            ours(["a"], padding=padding)
    with pytest.raises(ValueError, match="max_length must be an int >= 2"):
        ours.encode_batch(["a"], 1)
    with pytest.raises(ValueError, match="max_length must be an int >= 2"):
        ours("a", truncation=True, max_length=1)
    with pytest.raises(ValueError, match="truncation"):
        ours("a", truncation="only_second")
    # Without special tokens there is nothing to reserve room for.
    assert ours("a b c", add_special_tokens=False, max_length=1)["input_ids"] == ours.encode("a")[1:2]


def test_empty_batch(ours: BGEM3Tokenizer) -> None:
    assert ours.encode_batch([], 8) == []
    assert ours([]) == {"input_ids": [], "attention_mask": []}
    assert ours(["a"], return_attention_mask=False) == {"input_ids": [ours.encode("a")]}
