"""Build a tiny random-init causal LM and a char-level tokenizer, saved as a normal model directory.

Deterministic (seeded) and written atomically (temp dir + rename), so every worker
may call `ensure_tiny_model` on the same path and they all load identical weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from toolbox.models.loading import TinyModelConfig

SPECIAL = ["<pad>", "<s>", "</s>"]


def build_char_tokenizer(alphabet: str):  # noqa: ANN201 - transformers type
    """A ``PreTrainedTokenizerFast`` with one token per character of ``alphabet``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set(alphabet))
    vocab = {tok: i for i, tok in enumerate(SPECIAL + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # decode "12" as "12", not WordLevel's space-joined "1 2"
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    )


def _model_config(cfg: TinyModelConfig, tokenizer):  # noqa: ANN001, ANN202
    """The transformers config of a tiny ``cfg.arch`` model over ``tokenizer``'s vocabulary."""
    from transformers import LlamaConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig}.get(cfg.arch)
    if cls is None:
        raise ValueError(f"model.tiny.arch: {cfg.arch!r} is not supported; allowed: 'qwen2', 'llama'")
    return cls(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def ensure_tiny_model(path: str | os.PathLike[str], cfg: TinyModelConfig, alphabet: str, family: str = "hf") -> Path:
    """Write a tiny model of ``family`` (`toolbox.models.causal_lm.MODELS`) + tokenizer to ``path`` unless one is
    already there; return the path."""
    target = Path(path)
    if (target / "config.json").exists():
        return target  # before importing transformers: the driver resolves the path before any actor starts
    from toolbox.models.causal_lm import MODELS

    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer(cfg.alphabet or alphabet)
    tokenizer.model_max_length = cfg.max_positions  # stated, so a prompt longer than the model is a bad row
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        MODELS.get(family).factory().save_tiny(cfg, tokenizer, tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another worker got there first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return target
