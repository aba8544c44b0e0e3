"""The checkpoint's tokenizer on the `tokenizers` (Rust) library alone, without transformers or torch.

`transformers.AutoTokenizer` imports torch (+200 MB resident) only to read tokenizer.json; this module
builds from the checkpoint's files the same tokenizer transformers >= 5 builds (the reference FlagEmbedding
runs today; see `xlmr_pipeline` and docs/tokenizer.md), and offers the subset of the fast-tokenizer API the
package uses:

    tok = BGEM3Tokenizer.from_dir("path/to/bge-m3")
    tok.encode_batch(["What is BGE M3?"], max_length=8192)  # [[0, ..., 2]]

It is safe to share between threads: it never changes the backend's truncation or padding per call
(transformers does, which is what makes a shared fast tokenizer fail with "Already borrowed").
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Encoding, Tokenizer

from bgem3_embeddings.xlmr_pipeline import named_special_tokens, uses_xlm_roberta_class, xlm_roberta_backend

logger = logging.getLogger(__name__)

# XLM-R's special tokens, used for any the checkpoint's config files do not name.
DEFAULT_SPECIAL_TOKENS = {
    "bos": "<s>", "cls": "<s>", "eos": "</s>", "sep": "</s>", "pad": "<pad>", "unk": "<unk>", "mask": "<mask>"
}
VERY_LARGE_INTEGER = int(1e30)  # transformers' model_max_length when the config gives none
# transformers' clean_up_tokenization, applied by decode when tokenizer_config.json asks for it (BGE-M3 does).
CLEAN_UP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]


@dataclass(frozen=True)
class TokenSpan:
    """One token of a text: its id, its vocabulary entry and where it stands in the text.

    `text[start:stop]` is the token's characters (Python code points). `special`: the tokenizer added it
    around the text (<s>, </s>; start == stop); a literal "</s>" or an <unk> in the text has characters and
    is not special (the `tokenizers` special_tokens_mask, as text-embeddings-inference's /tokenize says).
    Example: TokenSpan(id=4865, piece="▁What", start=0, stop=4, special=False).
    """

    id: int
    piece: str
    start: int
    stop: int
    special: bool


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _check_texts(texts: Any) -> list[str]:
    if not isinstance(texts, list | tuple):  # a str would otherwise be encoded character by character
        raise TypeError(f"texts must be a list of str, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
    return list(texts)


class BGEM3Tokenizer:
    """A thread-safe wrapper of a `tokenizers.Tokenizer` with Hugging Face's fast-tokenizer call API.

    Example: `BGEM3Tokenizer(Tokenizer.from_file("tokenizer.json"), model_max_length=8192)("hi")`
    -> {"input_ids": [0, ..., 2], "attention_mask": [1, ..., 1]}.
    """

    def __init__(
        self,
        backend: Tokenizer,
        special_tokens: dict[str, str] | None = None,
        model_max_length: int = VERY_LARGE_INTEGER,
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        if backend.truncation is not None or backend.padding is not None:
            # Switch them off on a private copy once, here, rather than mutate the caller's object.
            backend = copy.deepcopy(backend)
            backend.no_truncation()
            backend.no_padding()
        self._backend = backend
        self.special_tokens = {**DEFAULT_SPECIAL_TOKENS, **(special_tokens or {})}
        ids = {name: backend.token_to_id(token) for name, token in self.special_tokens.items()}
        self.bos_token_id, self.cls_token_id = ids["bos"], ids["cls"]
        self.eos_token_id, self.sep_token_id = ids["eos"], ids["sep"]
        self.pad_token_id, self.unk_token_id, self.mask_token_id = ids["pad"], ids["unk"], ids["mask"]
        self.model_max_length = int(model_max_length)
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self._n_special = backend.num_special_tokens_to_add(False)  # 2 for XLM-R: <s> and </s>
        self._special_ids = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}

    @classmethod
    def from_dir(cls, root: str | Path) -> BGEM3Tokenizer:
        """Load the tokenizer of the checkpoint folder `root` as transformers >= 5 would, without it.

        An XLM-R checkpoint's tokenizer.json gives the vocabulary, character map and special tokens; the
        pipeline is rebuilt like transformers 5's XLMRobertaTokenizer (see `xlmr_pipeline`). Any other
        tokenizer class runs tokenizer.json as it is; a folder without one goes through transformers.

        Example: `BGEM3Tokenizer.from_dir("/models/bge-m3").cls_token_id` -> 0.
        """
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"cannot load the tokenizer from {root}: not a directory")
        try:
            config = _read_json(root / "tokenizer_config.json")
            special_map = _read_json(root / "special_tokens_map.json")
            special = {name: str(token) for name, token in named_special_tokens(config, special_map).items()}
            if (root / "tokenizer.json").is_file():
                backend = cls._backend_from_file(root, config, special_map)
            else:
                backend = cls._backend_from_transformers(root)
        except Exception as err:  # tokenizers, json and transformers raise many kinds; say where and why
            raise ValueError(f"cannot load the tokenizer from {root}: {err}") from err
        return cls(
            backend,
            special,
            model_max_length=int(config.get("model_max_length") or VERY_LARGE_INTEGER),
            clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
        )

    @staticmethod
    def _backend_from_file(root: Path, config: dict[str, Any], special_map: dict[str, Any]) -> Tokenizer:
        path = root / "tokenizer.json"
        model_type = _read_json(root / "config.json").get("model_type")
        if not uses_xlm_roberta_class(config, model_type if isinstance(model_type, str) else None):
            # transformers runs a tokenizer.json of a class without its own pipeline as it is.
            logger.info("%s: tokenizer class %r is not XLM-R's: using tokenizer.json as it is",
                        root, config.get("tokenizer_class"))
            return Tokenizer.from_file(str(path))
        tokenizer_json = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(tokenizer_json, dict):
            raise ValueError("tokenizer.json is not a JSON object")
        return xlm_roberta_backend(tokenizer_json, config, special_map)

    @staticmethod
    def _backend_from_transformers(root: Path) -> Tokenizer:
        # Only here is transformers imported (and torch with it): a folder with no tokenizer.json, e.g.
        # sentencepiece.bpe.model alone, needs its converter. Without any vocabulary file transformers
        # would build an XLM-R tokenizer of 5 tokens from config.json alone, so refuse that first.
        if not any(root.glob("*.model")) and not any(root.glob("vocab.*")):
            raise ValueError("no tokenizer.json and no vocabulary file (*.model, vocab.*) to convert")
        logger.info("no tokenizer.json in %s: converting its tokenizer with transformers", root)
        from transformers import AutoTokenizer

        backend = getattr(AutoTokenizer.from_pretrained(str(root)), "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            raise ValueError("transformers loaded no fast (tokenizers) tokenizer")
        return backend

    # ---------------------------------------------------------------- vocabulary
    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer`, truncation and padding off; deepcopy it to change it."""
        return self._backend

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> Any:
        """One token for an int, else a list: `tok.convert_ids_to_tokens([0, 2])` -> ['<s>', '</s>']."""
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        skip = self._special_ids if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of token ids, as transformers decodes: `tok.decode(tok.encode("hi"))` -> '<s> hi</s>'."""
        id_list = [ids] if isinstance(ids, int) else [int(i) for i in ids]
        text = self._backend.decode(id_list, skip_special_tokens=skip_special_tokens)
        for before, after in CLEAN_UP if self.clean_up_tokenization_spaces else []:
            text = text.replace(before, after)
        return text

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the special tokens (<s>, </s>, <pad>, <unk>, <mask>, ...)."""
        return frozenset(self._special_ids)

    # ---------------------------------------------------------------- encoding
    def _encode(
        self, texts: list[str], add_special_tokens: bool, max_length: int | None, offsets: bool
    ) -> list[Encoding]:
        """Encode with the backend's truncation off, truncate each Encoding, then add special tokens.

        This is what `Tokenizer.encode` does inside with truncation enabled, but with the limit passed per
        call instead of stored on the shared backend, so concurrent calls cannot interfere.
        """
        reserve = self._n_special if add_special_tokens else 0
        if max_length is not None and (type(max_length) is not int or max_length < reserve):
            raise ValueError(f"max_length must be an int >= {reserve} (special tokens), got {max_length!r}")
        backend = self._backend
        # encode_batch_fast skips computing offsets; tokenizers < 0.20 has only encode_batch.
        encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
        encode = backend.encode_batch if offsets else encode
        out = []
        for encoding in encode(texts, add_special_tokens=False):  # Rust encodes the list in parallel
            if max_length is not None and len(encoding) > max_length - reserve:
                encoding.truncate(max_length - reserve)
            out.append(backend.post_process(encoding, None, add_special_tokens))
        return out

    def encode_batch(self, texts: list[str], max_length: int) -> list[list[int]]:
        """Ids with <s> ... </s>, at most max_length each, unpadded (the encoder's hot path).

        Example: `tok.encode_batch(["What is BGE M3?", "BM25"], max_length=4)` -> [[0, a, b, 2], [0, c, 2]].
        """
        return [e.ids for e in self._encode(_check_texts(texts), True, max_length, offsets=False)]

    def token_spans(self, texts: list[str], max_length: int) -> list[list[TokenSpan]]:
        """Per text, its tokens with <s> ... </s> and their character spans: the ids `encode_batch` gives.

        Example: `tok.token_spans(["hi"], 8)[0]` -> [TokenSpan(0, "<s>", 0, 0, True), TokenSpan(id, "▁hi",
        0, 2, False), TokenSpan(2, "</s>", 0, 0, True)].
        """
        return [
            [
                TokenSpan(int(i), piece, int(start), int(stop), bool(added))
                for i, piece, (start, stop), added in zip(
                    e.ids, e.tokens, e.offsets, e.special_tokens_mask, strict=True
                )
            ]
            for e in self._encode(_check_texts(texts), True, max_length, offsets=True)
        ]

    def encode(self, text: str, add_special_tokens: bool = True, truncation: bool | str | None = None,
               max_length: int | None = None) -> list[int]:
        """Ids of one text: `tok.encode("hi", truncation=True, max_length=3)` -> [0, id, 2]."""
        out = self(text, add_special_tokens=add_special_tokens, truncation=truncation, max_length=max_length)
        return list(out["input_ids"])

    def __call__(
        self,
        text_or_texts: str | list[str],
        *,
        add_special_tokens: bool = True,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        padding: bool | str = False,
        return_attention_mask: bool | None = None,
        return_offsets_mapping: bool = False,
    ) -> dict[str, Any]:
        """transformers' call without padding: lists for one text, lists of lists for a list of texts.

        As in transformers, `truncation=None` truncates only when max_length is given, and
        `truncation=True` without max_length truncates to model_max_length.

        Example: `tok(["a", "b c"], max_length=8)["input_ids"]` -> [[0, x, 2], [0, y, z, 2]].
        """
        if padding not in (False, "do_not_pad"):
            raise ValueError(f"padding={padding!r} is not supported: padding is done by the encoder")
        if truncation is None:
            truncation = max_length is not None
        elif truncation in ("longest_first", "only_first"):
            truncation = True
        elif truncation == "do_not_truncate":
            truncation = False
        elif not isinstance(truncation, bool):
            raise ValueError(f"truncation must be a bool or 'longest_first', got {truncation!r}")
        limit = (self.model_max_length if max_length is None else max_length) if truncation else None

        single = isinstance(text_or_texts, str)
        texts = [text_or_texts] if isinstance(text_or_texts, str) else _check_texts(text_or_texts)
        encodings = self._encode(texts, add_special_tokens, limit, offsets=return_offsets_mapping)

        out: dict[str, list[Any]] = {"input_ids": [e.ids for e in encodings]}
        if return_attention_mask is not False:
            out["attention_mask"] = [[1] * len(e) for e in encodings]  # never padded: all ones
        if return_offsets_mapping:
            out["offset_mapping"] = [list(e.offsets) for e in encodings]
        return {key: value[0] for key, value in out.items()} if single else out
