"""The causal-LM seam: what a policy model is to the learners and the ``hf`` engine, and the families that make one.

A policy model is a `CausalLM` (forward to logits, a state dict, a config naming its vocabulary and special
tokens) and its tokenizer a `Tokenizer` (transformers' interface; the char-level one the tiny models use is one).
`MODELS` holds the families: ``hf`` (transformers' ``AutoModelForCausalLM``, any architecture it knows) and ``gpt``
(`toolbox.models.gpt`, a from-scratch GPT in plain torch); a plugin adds its own. A saved directory names its
family (``"toolbox_model"`` in its config.json; none: ``hf``), so every place that loads a model
(`toolbox.models.loading.load_causal_lm`) reaches the right one; ``model.name`` picks the family a tiny model is
built as. A model that decodes itself (`DecodesItself`) drives the engine's lean loop with its own KV cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from toolbox.core.registry import Registry
from toolbox.models.loading import TinyModelConfig


class LogitsOutput(Protocol):
    logits: torch.Tensor


class CausalLM(Protocol):
    """What the learners and the engine call on a policy model."""

    config: Any  # vocab_size, pad_token_id, eos_token_id (and _attn_implementation: which 4-D masks it takes)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = ...,
                 position_ids: torch.Tensor | None = ..., **kwargs: Any) -> LogitsOutput: ...

    def state_dict(self) -> dict[str, Any]: ...

    def save_pretrained(self, out: str | Path, **kwargs: Any) -> None: ...


class Tokenizer(Protocol):
    """The tokenizer interface the data and engine code use (transformers' ``PreTrainedTokenizerBase`` has it)."""

    pad_token_id: int | None
    eos_token_id: int | None

    def __call__(self, text: str, add_special_tokens: bool = ...) -> Any: ...

    def decode(self, ids: Any, skip_special_tokens: bool = ...) -> str: ...

    def __len__(self) -> int: ...

    def save_pretrained(self, out: str | Path) -> Any: ...


class Decoder(Protocol):
    """Prefill and one-token steps over a KV cache (`toolbox.engines.decode`'s loop drives it)."""

    def keep(self, rows: torch.Tensor) -> None: ...

    def prefill(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, pos_BP: torch.Tensor) -> torch.Tensor: ...

    def step(self, token_B: torch.Tensor, pos_B: torch.Tensor, keys_BL: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class DecodesItself(Protocol):
    """A model with its own KV-cache decoder for the lean loop (transformers models use a StaticCache instead)."""

    def decoder(self, batch: int, max_len: int) -> Decoder: ...


class ModelFamily(Protocol):
    """How a family loads a saved model and builds (and saves) a tiny random-init one."""

    def load(self, path: str, dtype: str, trust_remote_code: bool) -> nn.Module: ...

    def save_tiny(self, cfg: TinyModelConfig, tokenizer: Any, out: Path) -> None: ...


MODELS: Registry[ModelFamily] = Registry("model")


@MODELS.register("hf")
class HFFamily:
    """transformers' ``AutoModelForCausalLM``: any architecture it knows (a tiny one: ``model.tiny.arch``)."""

    def load(self, path: str, dtype: str, trust_remote_code: bool) -> nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                                    trust_remote_code=trust_remote_code)

    def save_tiny(self, cfg: TinyModelConfig, tokenizer: Any, out: Path) -> None:
        from transformers import AutoModelForCausalLM

        from toolbox.models.tiny import _model_config

        model = AutoModelForCausalLM.from_config(_model_config(cfg, tokenizer))
        model.save_pretrained(out)
        model.generation_config.save_pretrained(out)


@MODELS.register("gpt")
class GPTFamily:
    """toolbox's from-scratch GPT in plain torch (`toolbox.models.gpt`); a tiny one takes ``model.tiny``'s sizes."""

    def load(self, path: str, dtype: str, trust_remote_code: bool) -> nn.Module:
        from toolbox.models.gpt import GPT

        return GPT.from_pretrained(path, getattr(torch, dtype))

    def save_tiny(self, cfg: TinyModelConfig, tokenizer: Any, out: Path) -> None:
        from toolbox.models.gpt import GPT, GPTConfig

        GPT(GPTConfig(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                      num_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                      max_positions=cfg.max_positions, pad_token_id=tokenizer.pad_token_id,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)).save_pretrained(out)


def family_of(path: str) -> str:
    """The family a saved model directory declares (``"toolbox_model"`` in its config.json); ``hf`` otherwise
    (a transformers directory, or a hub id)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return "hf"
    declared = json.loads(config.read_text()).get("toolbox_model", "hf")
    return str(declared)
