"""A from-scratch GPT in plain torch: the proof that a model of your own trains and generates through the same
learner, engine and export paths as a Hugging Face one (`toolbox.models.causal_lm`).

Pre-norm transformer blocks (layer norm, causal multi-head attention with torch's scaled-dot-product kernel, a GELU
MLP), learned position embeddings indexed by ``position_ids`` (so left padding and packed rows restart positions as
they do for transformers models), an untied output head. It takes what the learners and the ``hf`` engine pass a
causal LM: ``input_ids``, a 2-D padding mask or a prepared 4-D boolean mask (packed rows, shared prompts),
``position_ids``, ``logits_to_keep``; and it decodes with its own KV cache (`GPTDecoder`, the engine's lean loop).
Saved as ``config.json`` (``"toolbox_model": "gpt"``) and ``model.safetensors`` beside the tokenizer.

Not covered: ``model.generate`` (the engine's ``decode: generate`` path), LoRA, activation checkpointing, rotary
positions, grouped-query attention (``num_kv_heads`` is ignored), the dry run's memory estimate (it sizes a qwen2).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

FAMILY = "gpt"


@dataclass
class GPTConfig:
    """The architecture; also what the learners read of a model's config (vocabulary, special tokens)."""

    vocab_size: int
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    max_positions: int = 64
    pad_token_id: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Masks this model takes, in transformers' terms: a 4-D mask is boolean (True: attend), as sdpa's.
    _attn_implementation: ClassVar[str] = "sdpa"


@dataclass
class CausalLMOutput:
    logits: torch.Tensor


class Block(nn.Module):
    """Pre-norm attention + MLP; attends over ``kv`` (a cache slice to write and read) when given."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.hidden_size), nn.LayerNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.fc = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.out = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, x_BTH: torch.Tensor, mask: torch.Tensor,
                cache: tuple[torch.Tensor, int] | None = None) -> torch.Tensor:
        b, t, h = x_BTH.shape
        q, k, v = (z.view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for z in self.qkv(self.ln_1(x_BTH)).split(h, dim=-1))
        if cache is not None:  # [2, B, heads, L, head_dim], written at start..start+t, read up to there
            kv, start = cache
            kv[0, :, :, start:start + t], kv[1, :, :, start:start + t] = k, v
            k, v = kv[0, :, :, :start + t], kv[1, :, :, :start + t]
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x_BTH = x_BTH + self.proj(att.transpose(1, 2).reshape(b, t, h))
        return x_BTH + self.out(F.gelu(self.fc(self.ln_2(x_BTH))))


class GPT(nn.Module):
    """A causal LM: ``forward(input_ids, attention_mask, position_ids) -> CausalLMOutput(logits)``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.hidden_size % config.num_heads:
            raise ValueError(f"model.tiny.hidden_size={config.hidden_size} must split into "
                             f"num_heads={config.num_heads} heads")
        self.config, self.name_or_path = config, ""
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.wpe = nn.Embedding(config.max_positions, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))  # `layers`: found by FSDP2 wrapping
        self.ln_f = nn.LayerNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        for p in self.parameters():  # GPT-2's init: N(0, 0.02) weights, zero biases, unit norms
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: int = 0, **_: Any) -> CausalLMOutput:
        """Logits ``[B, T, V]`` (the last ``logits_to_keep`` positions when > 0). ``attention_mask``: ``[B, T]``
        (1: a real token) or ``[B, 1, T, T]`` (boolean, or additive with 0 where attending); causal either way."""
        b, t = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device).expand(b, t)
        x = self.wte(input_ids) + self.wpe(position_ids)
        mask = attention_mask_4d(attention_mask, b, t, input_ids.device, position_ids)
        for block in self.layers:
            x = block(x, mask)
        x = x[:, -logits_to_keep:] if logits_to_keep else x
        return CausalLMOutput(self.lm_head(self.ln_f(x)))

    def decoder(self, batch: int, max_len: int) -> GPTDecoder:
        """A KV-cache decoder of ``batch`` rows of up to ``max_len`` tokens (the ``hf`` engine's lean loop)."""
        return GPTDecoder(self, batch, max_len)

    def save_pretrained(self, out: str | Path, state_dict: dict[str, torch.Tensor] | None = None, **_: Any) -> None:
        """``config.json`` and ``model.safetensors`` in ``out`` (a directory `from_pretrained` loads back)."""
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"toolbox_model": FAMILY, **asdict(self.config)}, indent=2))
        state = state_dict if state_dict is not None else self.state_dict()
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / "model.safetensors"))

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> GPT:
        from safetensors.torch import load_file

        fields = json.loads((Path(path) / "config.json").read_text())
        fields.pop("toolbox_model", None)
        model = cls(GPTConfig(**fields))
        model.load_state_dict(load_file(str(Path(path) / "model.safetensors")))
        model.name_or_path = str(path)
        return model.to(dtype)


def attention_mask_4d(mask: torch.Tensor | None, b: int, t: int, device: torch.device,
                      position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """A boolean ``[B, 1, T, T]`` mask, causal and, for a 2-D (or no) ``mask``, blind to padding keys and to other
    documents of a packed row: a document starts where ``position_ids`` restart at 0, as transformers reads packed
    rows. A 4-D ``mask`` is taken as prepared. Every query attends at least to itself, so a padding row is never
    fully masked (which would be NaN)."""
    causal = torch.ones((t, t), dtype=torch.bool, device=device).tril()
    if mask is None or mask.dim() == 2:
        allowed = causal.expand(b, t, t)
        if mask is not None:
            allowed = allowed & mask.bool()[:, None, :]
        if position_ids is not None:
            doc_BT = (position_ids == 0).cumsum(-1)
            allowed = allowed & (doc_BT[:, :, None] == doc_BT[:, None, :])
        allowed = allowed[:, None]
    else:
        allowed = (mask if mask.dtype == torch.bool else mask == 0) & causal
    return allowed | torch.eye(t, dtype=torch.bool, device=device)


class GPTDecoder:
    """Prefill and one-token steps over a KV cache, the interface of the engine's lean decode loop."""

    def __init__(self, model: GPT, batch: int, max_len: int) -> None:
        cfg, blocks = model.config, model.layers
        self.model = model
        head_dim = cfg.hidden_size // cfg.num_heads
        self.cache = torch.zeros((len(blocks), 2, batch, cfg.num_heads, max_len, head_dim), dtype=model.dtype,
                                 device=model.lm_head.weight.device)
        self.filled = 0  # cache slots written (the same for every row: prompts are left-padded)

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the current batch) stay in the cache."""
        self.cache = self.cache[:, :, rows]

    def prefill(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, pos_BP: torch.Tensor) -> torch.Tensor:
        """The prompts' forward; fills the cache, returns the last position's logits ``[B, V]``."""
        mask = attention_mask_4d(mask_BP, ids_BP.shape[0], ids_BP.shape[1], ids_BP.device)
        return self._run(ids_BP, pos_BP, mask)[:, -1]

    def step(self, token_B: torch.Tensor, pos_B: torch.Tensor, keys_BL: torch.Tensor) -> torch.Tensor:
        """One token per row at ``pos``; ``keys`` marks the cache slots each row attends to (the new one included)."""
        return self._run(token_B[:, None], pos_B[:, None], keys_BL[:, None, None, : self.filled + 1])[:, 0]

    def _run(self, ids_BT: torch.Tensor, pos_BT: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = m.wte(ids_BT) + m.wpe(pos_BT)
        for i, block in enumerate(m.layers):
            x = block(x, mask, (self.cache[i], self.filled))
        self.filled += ids_BT.shape[1]
        return m.lm_head(m.ln_f(x))
