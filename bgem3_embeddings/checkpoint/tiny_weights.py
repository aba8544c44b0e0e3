"""Generate a random-weight checkpoint in the exact BAAI/bge-m3 file layout (needs torch, sentencepiece and
transformers): what the model name `tiny` means (checkpoint/tiny.py), and the tests' checkpoints.

    python tests/tiny_checkpoint.py OUT_DIR [--weights safetensors|pytorch|both] [--size tiny|full] [--seed N]
                                    [--reranker]   (a cross-encoder: make_tiny_reranker_checkpoint)

Files written, as in the hub repo BAAI/bge-m3:
  config.json              xlm-roberta config (layer_norm_eps 1e-5, pad 1, 8194 positions, ...)
  model.safetensors        encoder state dict, keys without a "roberta." prefix   (--weights safetensors|both)
  pytorch_model.bin        the same state dict via torch.save                      (--weights pytorch|both)
  colbert_linear.pt        torch.save(nn.Linear(hidden, hidden).state_dict())
  sparse_linear.pt         torch.save(nn.Linear(hidden, 1).state_dict())
  sentencepiece.bpe.model  a small unigram model trained on SAMPLE_TEXT (XLM-R special-token layout)
  tokenizer.json           as transformers 4.x wrote it for BAAI/bge-m3 (Precompiled + " {2,}" normalizer)
  tokenizer_config.json, special_tokens_map.json

Weights are random but not "default init": every matrix, bias and LayerNorm parameter is drawn from a
seeded generator with O(1) activations, so attention is far from uniform and parity tests are meaningful.
The same seed gives identical weights whichever weight format is written.
"""

from __future__ import annotations

import io
import json
import logging
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import sentencepiece as spm
import torch
from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram
from torch import nn
from transformers import (
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
    XLMRobertaModel,
    XLMRobertaTokenizer,
)

logger = logging.getLogger(__name__)

Weights = Literal["safetensors", "pytorch", "both"]
Size = Literal["tiny", "full"]

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64},
    "full": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
}
FULL_VOCAB_SIZE = 250002  # BGE-M3's embedding table; the tiny tokenizer's ids are valid in it

# Training text for the tiny tokenizer: the model card's examples plus a few languages and scripts.
SAMPLE_TEXT = [
    "What is BGE M3?",
    "Defination of BM25",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms "
    "appearing in each document",
    "The quick brown fox jumps over the lazy dog.",
    "Dense retrieval maps each text to a single vector; sparse retrieval weights the tokens of the text.",
    "Multi-vector retrieval keeps one vector per token and scores a query against a passage with late "
    "interaction.",
    "A search engine returns the documents most relevant to the question of its user.",
    "Machine learning models learn patterns from data and generalise to new examples.",
    "The weather today is sunny with a light breeze from the west, and tomorrow it will rain.",
    "Paris is the capital of France, Berlin is the capital of Germany and Madrid is the capital of Spain.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Eine Suchmaschine findet die Dokumente, die zu einer Anfrage am besten passen.",
    "Maschinelles Lernen ist ein Teilgebiet der künstlichen Intelligenz.",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "Un moteur de recherche trouve les documents les plus pertinents pour une question.",
    "L'apprentissage automatique est une branche de l'intelligence artificielle.",
    "El rápido zorro marrón salta sobre el perro perezoso.",
    "Un motor de búsqueda encuentra los documentos más relevantes para una consulta.",
    "O rápido raposo castanho salta sobre o cão preguiçoso.",
    "La volpe marrone veloce salta sopra il cane pigro.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "Поисковая система находит документы, наиболее подходящие к запросу.",
    "Γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.",
    "敏捷的棕色狐狸跳过了懒狗。",
    "搜索引擎返回与查询最相关的文档。",
    "机器学习是人工智能的一个分支。",
    "素早い茶色の狐が怠惰な犬を飛び越える。",
    "検索エンジンは質問に最も関連する文書を返します。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "검색 엔진은 질문과 가장 관련 있는 문서를 찾습니다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول.",
    "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "Hızlı kahverengi tilki tembel köpeğin üzerinden atlar.",
    "Szybki brązowy lis przeskakuje nad leniwym psem.",
    "De snelle bruine vos springt over de luie hond.",
    "Numbers and symbols: 0 1 2 3 4 5 6 7 8 9, 3.14, 42%, $100, #tag, user@example.com (a, b) [c] {d}.",
]

# tokenizer_config.json and special_tokens_map.json as published in BAAI/bge-m3 (transformers 4.x style).
_MASK = {"content": "<mask>", "lstrip": True, "normalized": False, "rstrip": False, "single_word": False}
TOKENIZER_CONFIG: dict[str, Any] = {
    "bos_token": "<s>",
    "clean_up_tokenization_spaces": True,
    "cls_token": "<s>",
    "eos_token": "</s>",
    "mask_token": {"__type": "AddedToken", **_MASK, "normalized": True},
    "model_max_length": 8192,
    "pad_token": "<pad>",
    "sep_token": "</s>",
    "sp_model_kwargs": {},
    "tokenizer_class": "XLMRobertaTokenizer",
    "unk_token": "<unk>",
}
SPECIAL_TOKENS_MAP: dict[str, Any] = {
    **{
        key: {"content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
        for key, tok in [
            ("bos_token", "<s>"),
            ("cls_token", "<s>"),
            ("eos_token", "</s>"),
            ("pad_token", "<pad>"),
            ("sep_token", "</s>"),
            ("unk_token", "<unk>"),
        ]
    },
    "mask_token": _MASK,
}


def model_config(vocab_size: int, size: Size = "tiny") -> dict[str, Any]:
    """config.json content, key for key as in BAAI/bge-m3 (sizes from SIZES)."""
    return {
        "architectures": ["XLMRobertaModel"],
        "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0,
        "classifier_dropout": None,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        **SIZES[size],
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 8194,
        "model_type": "xlm-roberta",
        "output_past": True,
        "pad_token_id": 1,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "type_vocab_size": 1,
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def train_sentencepiece(path: Path, vocab_size: int = 1000) -> None:
    """Train a unigram sentencepiece model laid out like XLM-R's: <unk>=0, <s>=1, </s>=2, no pad.

    The HF XLM-R tokenizer shifts sentencepiece ids by one and puts <s>=0, <pad>=1, </s>=2, <unk>=3 in
    front and <mask> last, exactly as for the real 250002-token vocabulary.
    """
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SAMPLE_TEXT * 4),
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,  # the sample is small: take as many pieces as it supports
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,  # deterministic
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())


def xlm_roberta_v4_tokenizer(spm_path: Path) -> Tokenizer:
    """The tokenizer.json transformers 4.x's XLMRobertaConverter wrote for BAAI/bge-m3, from `spm_path`.

    Vocabulary <s> <pad> </s> <unk>, the sentencepiece pieces after its first three, <mask> last;
    normalizer Precompiled(the model's charsmap) then " {2,}" -> " "; Metaspace pre-tokenizer and
    decoder; "<s> $A </s>" template; <mask> added with lstrip, as published.
    """
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf code
    proto.ParseFromString(spm_path.read_bytes())
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    vocab = [(t, 0.0) for t in specials] + [(p.piece, p.score) for p in proto.pieces[3:]] + [("<mask>", 0.0)]
    tokenizer = Tokenizer(Unigram(vocab, unk_id=3, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence(
        [
            normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in specials]
        + [AddedToken("<mask>", lstrip=True, special=True, normalized=False)]
    )
    return tokenizer


def write_tokenizer(out_dir: Path) -> int:
    """Write the four tokenizer files into `out_dir`; return the tokenizer's vocabulary size."""
    spm_path = out_dir / "sentencepiece.bpe.model"
    train_sentencepiece(spm_path)
    tokenizer = xlm_roberta_v4_tokenizer(spm_path)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS_MAP, indent=2) + "\n")
    return tokenizer.get_vocab_size(with_added_tokens=True)


def save_transformers_v5_layout(checkpoint: Path, out_dir: Path) -> Path:
    """Write the tokenizer files transformers 5's save_pretrained makes of `checkpoint`'s into `out_dir`."""
    tokenizer = XLMRobertaTokenizer.from_pretrained(str(checkpoint))
    tokenizer.save_pretrained(str(out_dir))
    shutil.copy(checkpoint / "sentencepiece.bpe.model", out_dir / "sentencepiece.bpe.model")
    shutil.copy(checkpoint / "config.json", out_dir / "config.json")
    return out_dir


@torch.no_grad()
def randomise_(module: nn.Module, generator: torch.Generator) -> None:
    """Redraw every parameter in place: O(1) activations, non-trivial biases and LayerNorm affine."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            sub.weight.normal_(0.0, 1.0 / math.sqrt(sub.in_features), generator=generator)
            if sub.bias is not None:
                sub.bias.normal_(0.0, 0.1, generator=generator)
        elif isinstance(sub, nn.Embedding):
            sub.weight.normal_(0.0, 1.0, generator=generator)  # every row, the padding row included
        elif isinstance(sub, nn.LayerNorm):
            sub.weight.normal_(1.0, 0.2, generator=generator)
            sub.bias.normal_(0.0, 0.1, generator=generator)


def centre_sparse_bias_(
    head: nn.Linear, model: XLMRobertaModel, vocab_size: int, generator: torch.Generator
) -> float:
    """Set the sparse head's bias so that about half of a probe batch's tokens get a weight; returns the
    fraction that does.

    24 random post-LN layers leave every token's last hidden state pointing almost the same way (on the
    full-size checkpoint: a spread between tokens of 2e-4 against 1.05 for the values), so a random sparse
    head gives every token the same sign: all weights 0 after relu, and a check of sparse weights compares
    nothing. The bias becomes minus the median pre-activation over two rows of 64 random token ids
    (<s> ... </s>) of the tokenizer's vocabulary; the weights' spread stays what the model gives (small).
    """
    ids = torch.randint(3, vocab_size, (2, 64), generator=generator)
    ids[:, 0], ids[:, -1] = 0, 2  # <s>, </s> as the tokenizer adds them
    with torch.no_grad():
        hidden = model.eval()(input_ids=ids).last_hidden_state  # (2, 64, H)
        before = (hidden @ head.weight.T).squeeze(-1)
        head.bias.fill_(-float(before.median()))
        return float((before + head.bias > 0).float().mean())


def save_safetensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write a float32 safetensors file tensor by tensor (the library would copy all the bytes first)."""
    dtypes = {torch.float32: "F32", torch.float16: "F16", torch.int64: "I64"}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in tensors.items():
        end = offset + tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": dtypes[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # pad as the safetensors library does, to keep data 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for tensor in tensors.values():
            f.write(tensor.detach().contiguous().numpy().data)


def _check_options(weights: str, size: str) -> None:
    if weights not in ("safetensors", "pytorch", "both"):
        raise ValueError(f"weights must be safetensors, pytorch or both, got {weights!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")


def _write_weights(state: Mapping[str, torch.Tensor], out_dir: Path, weights: Weights) -> None:
    """model.safetensors and/or pytorch_model.bin holding `state`."""
    if weights in ("safetensors", "both"):
        save_safetensors(state, out_dir / "model.safetensors")
    if weights in ("pytorch", "both"):
        torch.save(state, out_dir / "pytorch_model.bin")


def make_tiny_checkpoint(
    out_dir: Path, *, weights: Weights = "safetensors", size: Size = "tiny", seed: int = 0
) -> Path:
    """Write a random checkpoint in the BAAI/bge-m3 layout into `out_dir` and return `out_dir`."""
    _check_options(weights, size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    vocab_size = tokenizer_vocab = write_tokenizer(out_dir)
    if size == "full":
        vocab_size = FULL_VOCAB_SIZE
    config = model_config(vocab_size, size)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    generator = torch.Generator().manual_seed(seed)
    hidden = config["hidden_size"]
    # Every parameter is redrawn below, so the library's own initialisation does not matter.
    model = XLMRobertaModel(XLMRobertaConfig(**config), add_pooling_layer=True)
    randomise_(model, generator)
    _write_weights(model.state_dict(), out_dir, weights)  # position_ids / token_type_ids: non-persistent

    for file_name, out_features in [("colbert_linear.pt", hidden), ("sparse_linear.pt", 1)]:
        head = nn.Linear(hidden, out_features)
        randomise_(head, generator)
        if file_name == "sparse_linear.pt" and size == "full":
            centre_sparse_bias_(head, model, tokenizer_vocab, generator)
        torch.save(head.state_dict(), out_dir / file_name)
    del model
    logger.info("wrote a %s checkpoint (%s weights, seed %d) to %s", size, weights, seed, out_dir)
    return out_dir


def reranker_config(vocab_size: int, size: Size = "tiny") -> dict[str, Any]:
    """config.json of BAAI/bge-reranker-v2-m3 (an XLM-R sequence classifier, one label), sized by SIZES."""
    return {
        **model_config(vocab_size, size),
        "architectures": ["XLMRobertaForSequenceClassification"],
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }


def make_tiny_reranker_checkpoint(
    out_dir: Path, *, weights: Weights = "safetensors", size: Size = "tiny", seed: int = 0
) -> Path:
    """Write a random cross-encoder in the BAAI/bge-reranker-v2-m3 layout into `out_dir`; return it.

    Files as in that hub repo: config.json (XLMRobertaForSequenceClassification, num_labels 1), the
    weights with keys "roberta.embeddings...", "roberta.encoder.layer.N..." and "classifier.dense.*",
    "classifier.out_proj.*" (no pooler), and the same tokenizer files as make_tiny_checkpoint.
    """
    _check_options(weights, size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(out_dir)
    if size == "full":
        vocab_size = FULL_VOCAB_SIZE
    config = reranker_config(vocab_size, size)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    model = XLMRobertaForSequenceClassification(XLMRobertaConfig(**config))
    randomise_(model, torch.Generator().manual_seed(seed))
    _write_weights(model.state_dict(), out_dir, weights)
    logger.info("wrote a %s reranker checkpoint (%s weights, seed %d) to %s", size, weights, seed, out_dir)
    return out_dir
