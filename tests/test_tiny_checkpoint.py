"""Generated test checkpoints: BAAI/bge-m3's layout and tokenizer conventions, deterministic weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.optional import require_module

torch = require_module("torch")
safetensors_numpy = require_module("safetensors.numpy")

from tests.tiny_checkpoint import (  # noqa: E402
    centre_sparse_bias_,
    make_tiny_checkpoint,
    reference_heads,
    reference_model,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
LAYOUT = {
    "config.json",
    "colbert_linear.pt",
    "sparse_linear.pt",
    "sentencepiece.bpe.model",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}


def test_layout_and_config(tiny_checkpoint: Path, tiny_checkpoint_pt: Path) -> None:
    assert {p.name for p in tiny_checkpoint.iterdir()} == LAYOUT | {"model.safetensors"}
    assert {p.name for p in tiny_checkpoint_pt.iterdir()} == LAYOUT | {"pytorch_model.bin"}
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert config["model_type"] == "xlm-roberta" and config["architectures"] == ["XLMRobertaModel"]
    ids = [config[k] for k in ("pad_token_id", "bos_token_id", "eos_token_id")]
    assert config["layer_norm_eps"] == 1e-5 and ids == [1, 0, 2]
    assert (config["type_vocab_size"], config["max_position_embeddings"]) == (1, 8194)
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (32, 2, 4)
    names = safetensors_numpy.load_file(tiny_checkpoint / "model.safetensors")
    assert "pooler.dense.weight" in names and not any(n.startswith("roberta.") for n in names)


def test_tokenizer_follows_xlm_roberta(tiny_checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    assert tokenizer.is_fast and len(tokenizer) == config["vocab_size"]
    special = [tokenizer.cls_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert special == [0, 1, 2, 3]
    assert tokenizer.mask_token_id == len(tokenizer) - 1
    # tokenizer.json as transformers 4.x wrote it for BAAI/bge-m3: the sentencepiece model's character map
    # (Precompiled) then " {2,}" -> " ", a Metaspace pre-tokenizer, <mask> added with lstrip.
    data = json.loads((tiny_checkpoint / "tokenizer.json").read_text())
    steps = data["normalizer"]["normalizers"]
    assert [step["type"] for step in steps] == ["Precompiled", "Replace"]
    assert steps[0]["precompiled_charsmap"] and steps[1]["pattern"] == {"Regex": " {2,}"}
    assert data["pre_tokenizer"]["type"] == data["decoder"]["type"] == "Metaspace"
    assert data["model"]["type"] == "Unigram" and data["model"]["unk_id"] == 3
    assert [t["content"] for t in data["added_tokens"]] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    assert data["added_tokens"][-1]["lstrip"] and data["added_tokens"][-1]["id"] == tokenizer.mask_token_id
    ids = tokenizer("What is BGE M3?")["input_ids"]
    assert ids[0] == 0 and ids[-1] == 2 and 3 not in ids
    assert 3 in tokenizer("ᚠᛇᚻ")["input_ids"]  # runes are not in the sample text: unknown


def test_reference_model_holds_the_file_weights(tiny_checkpoint: Path) -> None:
    model = reference_model(tiny_checkpoint)
    assert not model.training
    stored = safetensors_numpy.load_file(tiny_checkpoint / "model.safetensors")
    state = model.state_dict()
    assert set(stored) <= set(state)
    for name, value in stored.items():
        np.testing.assert_array_equal(state[name].numpy(), value, err_msg=name)
    # Weights are not the library's default init: LayerNorm and biases are randomised too.
    assert not np.allclose(stored["embeddings.LayerNorm.weight"], 1.0)
    assert not np.allclose(stored["encoder.layer.0.attention.self.query.bias"], 0.0)
    colbert, sparse = reference_heads(tiny_checkpoint)
    assert colbert.weight.shape == (32, 32) and sparse.weight.shape == (1, 32)


def test_generation_is_deterministic(tmp_path: Path, tiny_checkpoint: Path) -> None:
    again = make_tiny_checkpoint(tmp_path / "again", seed=0)
    other = make_tiny_checkpoint(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "colbert_linear.pt", "sentencepiece.bpe.model", "tokenizer.json"):
        assert (again / name).read_bytes() == (tiny_checkpoint / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


_MEASURE = """
import resource, sys
import numpy as np
from bgem3_embeddings.checkpoint.open_weights import open_tensor_source
total = 0
kept = []
with open_tensor_source(sys.argv[1]) as source:
    for name, info in source.infos().items():
        kept.append(source.read(name))
        total += kept[-1].nbytes
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / total)
"""


def test_centred_sparse_bias_gives_half_of_the_probe_tokens_a_weight(tiny_checkpoint: Path) -> None:
    """What the full-size generator does to its sparse head (there all tokens' pre-activations share one
    sign), checked on the tiny model with a head whose bias first silences every token."""
    model = reference_model(tiny_checkpoint)
    head = torch.nn.Linear(model.config.hidden_size, 1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        head.bias.fill_(-1e3)  # no token fires
    firing = centre_sparse_bias_(head, model, 100, generator)
    assert 0.4 <= firing <= 0.6, firing
    assert -1e3 < float(head.bias) < 1e3


@pytest.mark.slow
def test_full_size_checkpoint_reads_within_memory_budget(tmp_path: Path) -> None:
    """Full BGE-M3 size (2.27 GB per weight file): every tensor kept in memory, peak RSS <= 1.3x."""
    path = make_tiny_checkpoint(tmp_path / "full", weights="both", size="full")
    assert json.loads((path / "config.json").read_text())["vocab_size"] == 250002
    for name in ("model.safetensors", "pytorch_model.bin"):
        ratio = subprocess.run(
            [sys.executable, "-c", _MEASURE, str(path / name)],
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
        ).stdout
        assert float(ratio) <= 1.3, f"{name}: peak RSS {float(ratio):.3f}x the weights"
