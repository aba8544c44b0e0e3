"""BGEM3Tokenizer (tokenizers only) against the reference, transformers' AutoTokenizer, on the tiny model."""

from __future__ import annotations

import copy
import json
import logging
import random
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

from bgem3_embeddings.export.manifest import copy_tokenizer
from bgem3_embeddings.tokenizer import BGEM3Tokenizer
from tests.tiny_checkpoint import SAMPLE_TEXT, save_transformers_v5_layout

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
    for truncation in [True, None] if max_length else [False]:
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
    assert (
        tok(TEXTS, truncation=True, max_length=512)["input_ids"]
        == hf(TEXTS, truncation=True, max_length=512)["input_ids"]
    )
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


# ------------------------------------------------------------------ edge cases against transformers >= 5
# Each is a case where tokenizer.json as published (transformers 4.x) and transformers 5 can part ways,
# or where normalisation, pre-tokenisation or added-token matching has a corner.
EDGE_CASES = [
    # spaces, tabs, newlines and whitespace-only text
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    " \t\n\r\n ",
    "\u3000",
    " \u00a0 ",
    " leading",
    "   leading",
    "trailing ",
    "trailing   ",
    "  both  ",
    "repeated    spaces   inside",
    "tab\tseparated\tvalues\t",
    "\tleading tab",
    "new\nline\n",
    "\nleading newline",
    "crlf\r\nline\r\n",
    "para\n\n\nbreak",
    "mixed \t \n  run",
    # literal special tokens, with and without spaces around them, at the ends, adjacent
    "<s>",
    "</s>",
    "<pad>",
    "<mask>",
    "<unk>",
    "<s></s>",
    "<s> </s>",
    "<mask><mask>",
    "<pad><unk><s></s>",
    "a<mask>b",
    "a <mask> b",
    "a  <mask>  b",
    "a\t<mask>\nb",
    "end. <mask>x",
    "<s>a</s>",
    " <s> a </s> ",
    "x </s>",
    "x</s>",
    "x  </s>  ",
    "<pad> x <pad>",
    "<unk>x<unk>",
    "<s> ",
    " </s>",
    " <mask> ",
    "x <s> y </s> z <pad> w <unk> v <mask>",
    "<s",
    "s>",
    "< s >",
    "<S>",
    "<mask",
    "<<s>>",
    "</s/>",
    # combining marks: NFC and NFD spellings, stacked and lone marks
    "école",
    "e\u0301cole",
    "A\u030angstro\u0308m",
    "Ångström",
    "a\u0308\u0301",
    "\u0301 lone mark",
    "Vi\u1ec7t Nam",
    "Vie\u0323\u0302t Nam",
    "\u0915\u094d\u0937",
    "\u0e01\u0e34\u0e48",
    # emoji: ZWJ sequences, skin tones, variation selectors, flags, keycaps
    "👨‍👩‍👧‍👦",
    "❤️",
    "❤\ufe0e",
    "👍🏽",
    "🏳️‍🌈",
    "🇫🇷🇩🇪",
    "1️⃣",
    "🤗 hug",
    "emoji🙂inside",
    # CJK, Arabic and Hebrew with direction marks
    "敏捷的棕色狐狸",
    "日本語のテキスト。",
    "한국어 텍스트",
    "漢字　全角スペース",
    "中文，标点！",
    "الثعلب البني السريع",
    "\u200fعربي\u200f",
    "עברית \u200eEnglish\u200e עברית",
    "\u202bembedded\u202c",
    "\u061c\u0628\u0633\u0645",
    "שָׁלוֹם",
    # fullwidth and other NFKC-sensitive characters
    "ﬁ ﬂ ﬀ ﬃ",
    "x² H₂O ½",
    "ℌ ℍ ℕ ℝ",
    "① ② ⑩ ⑴",
    "Ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ！",
    "ｶﾀｶﾅ ﾊﾟ",
    "㍻ ㌔ ㎏",
    "Ⅻ ⅻ",
    "µ Ω Å K",
    "… ‥",
    "™ ℃ №",
    "ǅ ǈ",
    "\u2126\u212b",
    "ﷺ",
    # zero-width characters, no-break spaces, BOM, soft hyphen, controls
    "zero\u200bwidth",
    "\u200b",
    "\u200b \u200b",
    "\ufeffbom",
    "zwj\u200dzwnj\u200c",
    "nbsp\u00a0here",
    "\u00a0",
    "narrow\u202fnbsp",
    "word\u2060joiner",
    "soft\u00adhyphen",
    "null\x00char",
    "bell\x07",
    "\x1b[31mansi\x1b[0m",
    "del\x7f",
    "line\u2028sep\u2029para",
    "\x0bvt\x0cff\x85nel",
    # other scripts and casing corners
    "ẞ straße",
    "İstanbul ı",
    "ᚠᛇᚻ runes",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    "a" * 300,
    "ab " * 40,
]


@pytest.fixture(scope="module")
def v5_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint's tokenizer files as transformers 5's save_pretrained rewrites them."""
    return save_transformers_v5_layout(tiny_checkpoint, tmp_path_factory.mktemp("v5_layout"))


@pytest.fixture(scope="module", params=["published", "v5-saved"])
def pair(request: pytest.FixtureRequest, tiny_checkpoint: Path) -> tuple[BGEM3Tokenizer, Any]:
    """(ours, transformers') on the published (4.x) tokenizer.json layout and on transformers 5's."""
    root = tiny_checkpoint if request.param == "published" else request.getfixturevalue("v5_checkpoint")
    return BGEM3Tokenizer.from_dir(root), AutoTokenizer.from_pretrained(str(root))


def _pipeline(backend: Tokenizer) -> dict[str, Any]:
    """A backend's serialised pipeline, without the per-call truncation and padding settings."""
    data = json.loads(backend.to_str())
    return {key: value for key, value in data.items() if key not in ("truncation", "padding")}


def test_tiny_checkpoint_tokenizer_json_is_published_style(tiny_checkpoint: Path) -> None:
    data = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    assert [n["type"] for n in data["normalizer"]["normalizers"]] == ["Precompiled", "Replace"]
    assert data["pre_tokenizer"]["type"] == "Metaspace"
    # Run as published, it emits the "▁" pieces transformers 5 does not: the edge cases below can fail.
    published = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    differ = [t for t in EDGE_CASES if published.encode(t).ids != hf(t)["input_ids"]]
    assert {"trailing ", "x </s>", " ", "\n"} <= set(differ)


def test_pipeline_equals_transformers(pair: tuple[BGEM3Tokenizer, Any]) -> None:
    """Same normalizer, pre-tokenizer, model, post-processor, decoder and added tokens, field for field."""
    ours, hf = pair
    assert _pipeline(ours.backend_tokenizer) == _pipeline(hf.backend_tokenizer)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_edge_case_ids_match_transformers(pair: tuple[BGEM3Tokenizer, Any], add_special_tokens: bool) -> None:
    ours, hf = pair
    want = hf(EDGE_CASES, add_special_tokens=add_special_tokens)["input_ids"]
    assert ours(EDGE_CASES, add_special_tokens=add_special_tokens)["input_ids"] == want
    for text, ids in zip(EDGE_CASES, want, strict=True):
        assert ours(text, add_special_tokens=add_special_tokens)["input_ids"] == ids, repr(text)
        assert hf(text, add_special_tokens=add_special_tokens)["input_ids"] == ids  # batch == single there
    if add_special_tokens:
        assert ours.encode_batch(EDGE_CASES, 8192) == want
    # Whitespace-only text is no token at all, as in the sentencepiece model.
    assert all(ids == ([0, 2] if add_special_tokens else []) for ids in want[:10])


def test_edge_case_offsets_match_transformers(pair: tuple[BGEM3Tokenizer, Any]) -> None:
    ours, hf = pair
    for add_special_tokens in (True, False):
        kwargs: dict[str, Any] = {"add_special_tokens": add_special_tokens, "return_offsets_mapping": True}
        want = hf(EDGE_CASES, **kwargs)["offset_mapping"]
        assert ours(EDGE_CASES, **kwargs)["offset_mapping"] == want
        assert [ours(t, **kwargs)["offset_mapping"] for t in EDGE_CASES] == want
    # Every offset points into the text, and no token stands for spaces, tabs or line breaks alone.
    for text, spans in zip(
        EDGE_CASES, ours(EDGE_CASES, return_offsets_mapping=True)["offset_mapping"], strict=True
    ):
        assert all(0 <= s <= e <= len(text) for s, e in spans)
        assert all(text[s:e].strip(" \t\r\n") for s, e in spans if e > s), repr(text)


def test_edge_case_decode_matches_transformers(pair: tuple[BGEM3Tokenizer, Any]) -> None:
    ours, hf = pair
    for ids in hf(EDGE_CASES)["input_ids"]:
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_cut_exactly_at_max_length(pair: tuple[BGEM3Tokenizer, Any], add_special_tokens: bool) -> None:
    """Texts exactly max_length tokens long, one over and one under: truncation matches transformers."""
    ours, hf = pair
    texts = [
        t
        for t in EDGE_CASES + TEXTS[:11]
        if len(hf(t, add_special_tokens=add_special_tokens)["input_ids"]) > 3
    ]
    cut_any = False
    for text in texts:
        full = len(hf(text, add_special_tokens=add_special_tokens)["input_ids"])
        for max_length in (full - 1, full, full + 1):
            kwargs: dict[str, Any] = {
                "add_special_tokens": add_special_tokens,
                "truncation": True,
                "max_length": max_length,
            }
            want = hf(text, **kwargs)["input_ids"]
            assert ours(text, **kwargs)["input_ids"] == want, (text, max_length)
            assert len(want) == min(full, max_length)
            if add_special_tokens:
                assert ours.encode_batch([text], max_length) == [want]
                assert want[-1] == ours.eos_token_id
            cut_any |= len(want) < full
    assert cut_any and len(texts) > 50


# Characters the random texts are drawn from: every class the edge cases cover, and the special tokens as
# whole words so that they occur next to spaces, marks and each other.
_ATOMS = [
    " ",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u00a0",
    "\u3000",
    "\u200b",
    "\u200d",
    "\u200e",
    "\u200f",
    "\ufeff",
    "<s>",
    "</s>",
    "<pad>",
    "<mask>",
    "<unk>",
    "<",
    ">",
    "/",
    "s",
    "\u0301",
    "\u0308",
    "\ufe0f",
    "🏽",
    "👨",
    "❤",
    "🇫",
    "敏",
    "日",
    "한",
    "ا",
    "ש",
    "ﬁ",
    "²",
    "ℌ",
    "①",
    "Ｆ",
    "ｶ",
    "ﾟ",
    "ẞ",
    "İ",
    "\x00",
    ".",
    "the",
    "quick",
    "BGE",
    "M3",
    "é",
    "ü",
    "ß",
    "ö",
    "ç",
    "9",
]


def _random_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        pieces = [rng.choice(_ATOMS) for _ in range(rng.randint(0, 12))]
        # Mix in arbitrary code points of the Basic Multilingual Plane and beyond (no surrogates).
        for _ in range(rng.randint(0, 3)):
            cp = rng.randint(1, 0x2FFFF)
            if not 0xD800 <= cp <= 0xDFFF:
                pieces.insert(rng.randint(0, len(pieces)), chr(cp))
        texts.append("".join(pieces))
    return texts


def test_random_texts_match_transformers(pair: tuple[BGEM3Tokenizer, Any]) -> None:
    """Seeded random mixes of spaces, special tokens, marks, emoji and scripts: ids, offsets and decode."""
    ours, hf = pair
    texts = _random_texts(seed=12, count=400)
    kwargs: dict[str, Any] = {"return_offsets_mapping": True}
    want, got = hf(texts, **kwargs), ours(texts, **kwargs)
    for i, text in enumerate(texts):
        assert got["input_ids"][i] == want["input_ids"][i], repr(text)
        assert got["offset_mapping"][i] == want["offset_mapping"][i], repr(text)
        assert ours.decode(got["input_ids"][i]) == hf.decode(want["input_ids"][i]), repr(text)
    assert ours.encode_batch(texts, 16) == hf(texts, truncation=True, max_length=16)["input_ids"]


# tokenizer_config.json / special_tokens_map.json / tokenizer.json variants other saves of an XLM-R
# checkpoint carry; transformers resolves the special tokens differently for each.
def _variant(root: Path, name: str) -> None:
    config = json.loads((root / "tokenizer_config.json").read_text())
    data = json.loads((root / "tokenizer.json").read_text())
    if name == "added_tokens_decoder":  # as transformers 4.34+ saves it; special_tokens_map.json is ignored
        config["added_tokens_decoder"] = {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in data["added_tokens"]
        }
        config["added_tokens_decoder"][str(data["added_tokens"][-1]["id"])]["rstrip"] = True
    elif name == "no_special_tokens_map":
        (root / "special_tokens_map.json").unlink()
    elif name == "mask_without_lstrip":
        data["added_tokens"][-1]["lstrip"] = False
    elif name == "no_prefix_space":
        config["add_prefix_space"] = False
    elif name == "extra_special_token":
        config["additional_special_tokens"] = ["<extra>"]
    elif name == "no_tokenizer_class":  # AutoTokenizer falls back to config.json's model_type
        del config["tokenizer_class"]
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "variant",
    [
        "added_tokens_decoder",
        "no_special_tokens_map",
        "mask_without_lstrip",
        "no_prefix_space",
        "extra_special_token",
        "no_tokenizer_class",
    ],
)
def test_config_variants_match_transformers(tiny_checkpoint: Path, tmp_path: Path, variant: str) -> None:
    for path in tiny_checkpoint.iterdir():
        if path.name != "model.safetensors":
            shutil.copy(path, tmp_path / path.name)
    _variant(tmp_path, variant)
    ours, hf = BGEM3Tokenizer.from_dir(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    assert _pipeline(ours.backend_tokenizer) == _pipeline(hf.backend_tokenizer)
    texts = [*EDGE_CASES, "a <extra> b<extra>c", "x <mask>y <mask> z"]
    assert ours(texts)["input_ids"] == hf(texts)["input_ids"]
    for name in ("cls", "eos", "pad", "unk", "mask"):
        assert getattr(ours, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name


def test_other_tokenizer_class_runs_tokenizer_json_as_is(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A class without its own pipeline in transformers 5 (TokenizersBackend) runs the file as it is."""
    for path in tiny_checkpoint.iterdir():
        if path.name != "model.safetensors":
            shutil.copy(path, tmp_path / path.name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "TokenizersBackend"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, hf = BGEM3Tokenizer.from_dir(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
    assert ours(EDGE_CASES)["input_ids"] == hf(EDGE_CASES)["input_ids"]
    xlmr = BGEM3Tokenizer.from_dir(tiny_checkpoint)
    assert ours("trailing ")["input_ids"] != xlmr("trailing ")["input_ids"]  # the trailing "▁" is back


def test_non_unigram_tokenizer_json_is_a_value_error(tiny_checkpoint: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_checkpoint / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    data = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    data["model"] = {"type": "WordLevel", "vocab": {"<unk>": 0}, "unk_token": "<unk>"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="no Unigram vocabulary"):
        BGEM3Tokenizer.from_dir(tmp_path)


def test_exported_tokenizer_json_gives_the_reference_ids(
    tiny_checkpoint: Path, hf: Any, tmp_path: Path
) -> None:
    """The export's tokenizer/ folder: tokenizers alone, and transformers, give transformers 5's ids."""
    dest = tmp_path / "tokenizer"
    assert "tokenizer.json" in copy_tokenizer(tiny_checkpoint, dest)
    want = hf(EDGE_CASES)["input_ids"]
    plain = Tokenizer.from_file(str(dest / "tokenizer.json"))
    assert [e.ids for e in plain.encode_batch(EDGE_CASES)] == want
    exported = AutoTokenizer.from_pretrained(str(dest))
    assert exported(EDGE_CASES)["input_ids"] == want
    assert _pipeline(exported.backend_tokenizer) == _pipeline(hf.backend_tokenizer)
    assert BGEM3Tokenizer.from_dir(dest)(EDGE_CASES)["input_ids"] == want
