"""transformers 5's XLM-R tokenizer, rebuilt from a checkpoint's files with the `tokenizers` library alone.

FlagEmbedding loads BGE-M3's tokenizer with `transformers.AutoTokenizer`. transformers >= 5 does not run
the checkpoint's tokenizer.json as published: its `XLMRobertaTokenizer` takes only the vocabulary, the
sentencepiece character map and the special tokens from the files and builds its own pipeline:

    normalizer      Precompiled(charsmap)                 (tokenizer.json's " {2,}" -> " " step is dropped)
    pre-tokenizer   WhitespaceSplit, Metaspace("▁", always) (whitespace never becomes a token)
    model           Unigram(vocab, unk_id=3, byte_fallback=False)
    post-processor  TemplateProcessing("<s> $A </s>", pair "<s> $A </s> </s> $B </s>")
    decoder         Metaspace("▁", always)
    added tokens    from tokenizer_config.json's added_tokens_decoder, else tokenizer.json's added_tokens,
                    plus any named special token still missing

so that, like the original sentencepiece model, a trailing space, whitespace-only text and the space in
front of a literal special token give no "▁" token. `xlm_roberta_backend` builds the same
`tokenizers.Tokenizer` here (tests compare the two serialisations and the ids, offsets and decodes).

Example: `xlm_roberta_backend(json.loads(Path("tokenizer.json").read_text()), config, special_map)`.
"""

from __future__ import annotations

import base64
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram

# transformers' SPECIAL_TOKENS_ATTRIBUTES, without the "_token" suffix.
SPECIAL_NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
XLMR_UNK_ID = 3  # transformers' XLMRobertaTokenizer hard-codes it, whatever tokenizer.json says
# Classes AutoTokenizer resolves to transformers' XLMRobertaTokenizer (the "Fast" name is an alias in v5),
# and the model types that pick it when tokenizer_config.json names no class (transformers' auto mapping).
XLMR_CLASSES = {"XLMRobertaTokenizer", "XLMRobertaTokenizerFast"}
XLMR_MODEL_TYPES = {"xlm-roberta", "xmod", "gte", "jina_embeddings_v3", "metaclip_2", "trocr"}


def uses_xlm_roberta_class(config: dict[str, Any], model_type: str | None) -> bool:
    """True when transformers 5 would load these files with its XLMRobertaTokenizer class.

    `config` is tokenizer_config.json, `model_type` config.json's model_type (None without one).
    """
    name = config.get("tokenizer_class")
    if isinstance(name, str):
        return name in XLMR_CLASSES
    return model_type in XLMR_MODEL_TYPES


def _added_token(value: Any, special: bool | None = None) -> AddedToken | str | None:
    """An AddedToken from a config entry (a str stays a str, as in transformers)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        fields = {k: v for k, v in value.items() if k in ("content", "single_word", "lstrip", "rstrip",
                                                           "normalized", "special")}
        if special is not None:
            fields["special"] = special
        return AddedToken(**fields)
    return None


def _has_added_tokens_decoder(config: dict[str, Any]) -> bool:
    return isinstance(config.get("added_tokens_decoder"), dict)


def named_special_tokens(config: dict[str, Any], special_map: dict[str, Any]) -> dict[str, AddedToken | str]:
    """The named special tokens ("bos" ... "mask") as transformers 5 resolves them from the config files.

    tokenizer_config.json's `<name>_token` entries count; special_tokens_map.json overrides them only
    when tokenizer_config.json has no added_tokens_decoder (transformers reads it as a legacy file).
    A name with a "__type": "AddedToken" dict keeps its flags; a plain dict entry is ignored, as there.
    """
    tokens: dict[str, AddedToken | str] = {}
    for name in SPECIAL_NAMES:
        value = config.get(f"{name}_token")
        if isinstance(value, dict) and value.get("__type") != "AddedToken":
            value = None
        token = _added_token(value)
        if token is not None:
            tokens[name] = token
    if not _has_added_tokens_decoder(config):
        for name in SPECIAL_NAMES:
            value = special_map.get(f"{name}_token")
            token = _added_token(value, special=True if isinstance(value, dict) else None)
            if token is not None:
                tokens[name] = token
    return tokens


def _extra_special_tokens(config: dict[str, Any], special_map: dict[str, Any]) -> list[AddedToken | str]:
    """additional_special_tokens / extra_special_tokens lists (strings or AddedToken dicts)."""
    sources = [config] + ([] if _has_added_tokens_decoder(config) else [special_map])
    out: list[AddedToken | str] = []
    for source in sources:
        for key in ("additional_special_tokens", "extra_special_tokens"):
            values = source.get(key)
            for value in values if isinstance(values, list) else []:
                token = _added_token(value)
                if token is not None and str(token) not in {str(t) for t in out}:
                    out.append(token)
    return out


def _declared_added_tokens(tokenizer_json: dict[str, Any], config: dict[str, Any]) -> dict[int, AddedToken]:
    """Added tokens by id: tokenizer_config.json's added_tokens_decoder, else tokenizer.json's list."""
    declared: dict[int, AddedToken] = {}
    if _has_added_tokens_decoder(config):
        entries = [(int(i), value) for i, value in config["added_tokens_decoder"].items()]
    else:
        entries = [(int(t["id"]), t) for t in tokenizer_json.get("added_tokens") or [] if "id" in t]
    for index, value in entries:
        token = _added_token(value)
        if isinstance(token, AddedToken):
            declared[index] = token
    return declared


def _tokens_to_add(
    tokenizer_json: dict[str, Any], config: dict[str, Any], named: dict[str, AddedToken | str],
    extra: list[AddedToken | str],
) -> list[AddedToken]:
    """The added tokens in transformers' order: declared ones by id, then missing named/extra ones."""
    declared = _declared_added_tokens(tokenizer_json, config)
    tokens: list[AddedToken | str] = [token for _, token in sorted(declared.items())]
    by_content = {str(t): t for t in tokens}
    for token in [*named.values(), *extra]:
        if str(token) not in by_content:
            tokens.append(token)
            by_content[str(token)] = token
    named_contents = {str(t) for t in named.values()}
    out: list[AddedToken] = []
    for token in tokens:
        if isinstance(token, str):
            token = AddedToken(token, special=True)
        elif not token.special and token.content in named_contents:
            token.special = True  # transformers marks named tokens special, keeping the other flags
        out.append(token)
    return out


def precompiled_charsmap(normalizer: Any) -> bytes | None:
    """The sentencepiece character map of a tokenizer.json normalizer (alone or in a Sequence), if any."""
    if not isinstance(normalizer, dict):
        return None
    steps = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else [normalizer]
    for step in steps if isinstance(steps, list) else []:
        if isinstance(step, dict) and step.get("type") == "Precompiled" and step.get("precompiled_charsmap"):
            return base64.b64decode(step["precompiled_charsmap"])
    return None


def xlm_roberta_backend(
    tokenizer_json: dict[str, Any], config: dict[str, Any], special_map: dict[str, Any]
) -> Tokenizer:
    """The `tokenizers.Tokenizer` transformers 5's XLMRobertaTokenizer builds from these file contents.

    `tokenizer_json` is the parsed tokenizer.json, `config` tokenizer_config.json, `special_map`
    special_tokens_map.json ({} for a missing file). Raises ValueError if tokenizer.json holds no
    Unigram vocabulary.
    """
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type", "Unigram") != "Unigram" or not isinstance(vocab, list) or not vocab:
        raise ValueError(f"tokenizer.json has no Unigram vocabulary (model type {model.get('type')!r})")
    backend = Tokenizer(Unigram([(str(p), float(s)) for p, s in vocab], XLMR_UNK_ID, False))
    charsmap = precompiled_charsmap(tokenizer_json.get("normalizer"))
    if charsmap is not None:
        backend.normalizer = normalizers.Precompiled(charsmap)
    scheme = "always" if config.get("add_prefix_space", True) else "never"
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)]
    )
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)

    named = named_special_tokens(config, special_map)
    extra = _extra_special_tokens(config, special_map)
    backend.add_tokens(_tokens_to_add(tokenizer_json, config, named, extra))
    backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

    bos, eos = str(named.get("bos", "<s>")), str(named.get("eos", "</s>"))
    backend.post_processor = processors.TemplateProcessing(
        single=[bos, "$A", eos],
        pair=[bos, "$A", eos, eos, "$B", eos],
        special_tokens=[(bos, _token_id(backend, bos)), (eos, _token_id(backend, eos))],
    )
    return backend


def _token_id(backend: Tokenizer, token: str) -> int:
    index = backend.token_to_id(token)
    if index is None:  # transformers would map it to <unk>; a template needs a real id
        raise ValueError(f"special token {token!r} is not in the vocabulary")
    return index
