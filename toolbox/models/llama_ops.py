"""The arithmetic of a Llama-family decoder block (Llama, Qwen2, Mistral) as transformers computes it, in plain torch:
what the engine's decode loop (`toolbox.engines.llama_decode`) and toolbox's own module (`toolbox.models.lean_llama`)
both run. The attention masks are the ones transformers builds for the same inputs, except that a padding query
also attends to itself, so no row of a mask is empty (an empty row makes NaN, which a backward spreads).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def rope(pos_BT: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """transformers' default rotary embedding (cos, sin) of the positions, ``[B, 1, T, D]`` to broadcast over heads."""
    freqs = pos_BT[..., None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """The model's RMSNorm (computed in fp32, as transformers does, then scaled by its weight)."""
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)


def heads(proj: torch.nn.Module, x: torch.Tensor, n: int, head_dim: int) -> torch.Tensor:
    """A projection of ``x [B, T, H]`` split into ``n`` heads, ``[B, n, T, head_dim]``."""
    b, t, _ = x.shape
    return proj(x).view(b, t, n, head_dim).transpose(1, 2)


def mlp(block: Any, x: torch.Tensor) -> torch.Tensor:
    """The gated SiLU MLP of a block (``down(silu(gate(x)) * up(x))``)."""
    return block.down_proj(F.silu(block.gate_proj(x)) * block.up_proj(x))


def _causal(t: int, device: torch.device) -> torch.Tensor:
    return torch.ones((t, t), dtype=torch.bool, device=device).tril()


def padding_mask(mask_BT: torch.Tensor) -> torch.Tensor:
    """The causal mask ``[B, 1, T, T]`` of left-padded rows (``mask_BT``: 1 at real tokens)."""
    t = mask_BT.shape[1]
    eye = torch.eye(t, dtype=torch.bool, device=mask_BT.device)
    return ((_causal(t, mask_BT.device) & mask_BT.bool()[:, None, :]) | eye)[:, None]


def packed_mask(pos_BT: torch.Tensor) -> torch.Tensor:
    """The causal mask ``[B, 1, T, T]`` of packed rows: a sequence starts wherever the position does not follow the
    one before (transformers' ``find_packed_sequence_indices``), and attends only within itself."""
    t = pos_BT.shape[1]
    starts = torch.diff(pos_BT, prepend=pos_BT[:, :1] - 1, dim=-1) != 1
    seq_BT = starts.cumsum(-1)
    return (_causal(t, pos_BT.device) & (seq_BT[:, :, None] == seq_BT[:, None, :]))[:, None]
