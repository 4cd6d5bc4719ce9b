"""The lean loop's own forward for Llama-family models (Llama, Qwen2, Mistral without a sliding window).

`model.forward` of transformers costs, per decoder layer and token, about 40 torch ops and as much Python
again (attention-interface dispatch, cache objects, mask and output classes): on a CPU, at the small batches
an RL rollout decodes, that is half of a step. `LlamaDecoder` runs the same arithmetic with the model's own
parameters (read from its modules at each call, so weight loads need nothing more; on a CPU kept column-major,
`column_major_weights`) in about 20 ops per layer:
`F.rms_norm`, the projections, rotary embeddings for the new positions only, its own KV cache of
``[layers, 2, B, kv heads, L, head_dim]`` that a finished row leaves with one index, and one
`F.scaled_dot_product_attention` per layer over the slots filled so far (grouped-query heads shared with
``enable_gqa``). Hand-written because it replaces exactly the generic code whose cost it removes; the
transformers forward stays the reference: tests compare the logits of both at prefill and at every step.

`unsupported` says why a model cannot take it (another architecture, a non-default RoPE, a sliding window,
biases on the MLP, an adapter wrapped in); `toolbox.engines.decode` then runs the transformers forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from toolbox.models.llama_ops import MODEL_TYPES, heads, mlp, padding_mask, rms_norm, rope, rotate

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def unsupported(model: PreTrainedModel) -> str | None:
    """Why ``model`` cannot use `LlamaDecoder` (``None``: it can)."""
    cfg = model.config
    if MODEL_TYPES.get(cfg.model_type) != type(model).__name__:
        return f"model type {cfg.model_type!r} ({type(model).__name__}) is not one of {tuple(MODEL_TYPES)}"
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"RoPE type {rope.get('rope_type')!r}"
    if cfg.hidden_act != "silu":
        return f"activation {cfg.hidden_act!r}"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    for layer in model.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            return "sliding-window attention"
        if any(getattr(layer.mlp, p).bias is not None for p in ("gate_proj", "up_proj", "down_proj")):
            return "MLP biases"
        if type(layer.self_attn.q_proj) is not torch.nn.Linear:
            return "adapted projections (peft)"
    return None


@torch.no_grad()
def column_major_weights(model: PreTrainedModel) -> int:
    """On a CPU, store every projection weight ``[out, in]`` column-major (strides ``(1, out)``), unless it already
    is; returns how many were moved. ``x @ W.T`` then reads ``W.T`` row by row, which MKL's single-precision GEMM
    does ~20% faster at the decode loop's few rows (a 32-row call of the small and medium benchmark models: -21% CPU,
    `toolbox bench decode --cases small,medium`). Values are untouched, so every reader (weight loads, ``state_dict``, transformers'
    forward) sees the same model. A weight load may put a weight back in the row-major layout of its bucket (it
    re-points parameters at the bucket's memory): the next call moves it again, one copy per weight version."""
    moved = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, torch.nn.Linear) or weight is None or weight.device.type != "cpu":
            continue
        if weight.stride() != (1, weight.shape[0]):
            weight.data = weight.data.t().contiguous().t()
            moved += 1
    return moved


class LlamaDecoder:
    """Prefill and one-token steps of a Llama-family causal LM over its own KV cache (inference mode only)."""

    def __init__(self, model: PreTrainedModel, batch: int, max_len: int) -> None:
        cfg, attn = model.config, model.model.layers[0].self_attn
        self.model = model
        self.layers = model.model.layers
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        self.q_size = self.heads * self.head_dim
        rotary = model.model.rotary_emb
        self.inv_freq, self.rope_scale = rotary.inv_freq.float(), float(rotary.attention_scaling)
        param = model.lm_head.weight
        self.cache = torch.zeros((len(self.layers), 2, batch, self.kv_heads, max_len, self.head_dim),
                                 dtype=param.dtype, device=param.device)
        self.filled = 0  # cache slots written so far (the same for every row: prompts are left-padded)

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the current batch) stay in the cache."""
        self.cache = self.cache[:, :, rows]

    def prefill(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, pos_BP: torch.Tensor) -> torch.Tensor:
        """The prompts' forward (left-padded; ``pos`` counts real tokens): fills the cache, returns the last
        position's logits ``[B, V]``."""
        return self._logits(self._prefill(ids_BP, mask_BP, pos_BP)[:, -1])

    def _prefill(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, pos_BP: torch.Tensor) -> torch.Tensor:
        return self._layers(self.model.model.embed_tokens(ids_BP), pos_BP, padding_mask(mask_BP))

    def step(self, token_B: torch.Tensor, pos_B: torch.Tensor, keys_BL: torch.Tensor) -> torch.Tensor:
        """One new token per row at position ``pos``; ``keys`` marks the cache slots each row attends to (the
        new one included). Returns the logits ``[B, V]``."""
        hidden = self._layers(self.model.model.embed_tokens(token_B[:, None]), pos_B[:, None],
                              keys_BL[:, None, None, : self.filled + 1])
        return self._logits(hidden[:, 0])

    def _layers(self, hidden: torch.Tensor, pos_BT: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = hidden.shape
        cos, sin = rope(pos_BT, self.inv_freq, self.rope_scale, self.cache.dtype)  # [B, 1, T, D]
        start, end = self.filled, self.filled + t
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = rms_norm(hidden, layer.input_layernorm)
            kv = self.cache[i]
            kv[0, :, :, start:end] = rotate(heads(attn.k_proj, x, self.kv_heads, self.head_dim), cos, sin)
            kv[1, :, :, start:end] = heads(attn.v_proj, x, self.kv_heads, self.head_dim)
            q = rotate(heads(attn.q_proj, x, self.heads, self.head_dim), cos, sin)
            out = F.scaled_dot_product_attention(q, kv[0, :, :, :end], kv[1, :, :, :end], attn_mask=mask,
                                                 scale=self.scale, enable_gqa=True)
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, t, self.q_size))
            hidden = hidden + mlp(layer.mlp, rms_norm(hidden, layer.post_attention_layernorm))
        self.filled = end
        return hidden

    def _logits(self, hidden_BH: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(rms_norm(hidden_BH, self.model.model.norm))
