"""A Llama-family causal LM (Llama, Qwen2, Mistral) in plain torch: the ``hf`` engine's model where its lean loop
runs toolbox's own decoder (`toolbox.engines.llama_decode.LlamaDecoder`), and the learners' trained policy
(``learner.forward: auto``).

Both read nothing of a transformers model but its parameters and a few config values, so they need transformers'
modeling code only to build the module tree. `LeanLlama` is that tree with the same parameter names and shapes,
built from the directory's ``config.json`` and filled from its safetensors, with a whole-sequence `forward` that
trains (padded, packed and shared-prompt rows; activation checkpointing; FSDP2 shards each block as it does
transformers'): a rollout worker or learner rank then never imports ``transformers.modeling_utils`` (with
dynamo, sympy and accelerate behind it): about 2 CPU s and 80-100 MiB less per process (`toolbox bench startup`).
Weight syncs, ``state_dict`` and checkpoints see the names transformers uses, so a checkpoint or an export of
either model loads into the other. Hand-written because it is the part of transformers' model the lean loop and
the learners use, and nothing more; the transformers model stays the reference (tests compare tokens, logits and
gradients).

`lean_unsupported` says why a directory needs transformers' model instead (another architecture, a RoPE or
attention variant `LlamaDecoder` does not compute, remote code, quantized or non-safetensors weights); the engine
then loads that, as it does for ``decode: generate``, ``forward: transformers`` and LoRA adapters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from toolbox.models.llama_ops import (
    MODEL_TYPES,
    heads,
    mlp,
    packed_mask,
    padding_mask,
    rms_norm,
    rope,
    rotate,
)

if TYPE_CHECKING:
    from toolbox.engines.llama_decode import LlamaDecoder

SINGLE_FILE, INDEX = "model.safetensors", "model.safetensors.index.json"

log = logging.getLogger(__name__)


def lean_unsupported(path: str | Path) -> str | None:
    """Why the model saved at ``path`` cannot load as a `LeanLlama` (``None``: it can)."""
    root = Path(path)
    if not (root / "config.json").is_file():
        return "no local config.json (a hub id)"
    cfg = json.loads((root / "config.json").read_text())
    model_type = cfg.get("model_type")
    if MODEL_TYPES.get(model_type) is None or cfg.get("architectures", [MODEL_TYPES[model_type]]) != [MODEL_TYPES[model_type]]:
        return f"architecture {cfg.get('architectures')} ({model_type!r})"
    for key, why in (("auto_map", "remote code"), ("quantization_config", "quantized weights"),
                     ("mlp_bias", "MLP biases"), ("use_sliding_window", "sliding-window attention")):
        if cfg.get(key):
            return why
    if model_type != "qwen2" and cfg.get("sliding_window"):  # qwen2 uses it only with use_sliding_window
        return "sliding-window attention"
    if any(kind != "full_attention" for kind in cfg.get("layer_types") or []):
        return "sliding-window attention"
    rope = _rope(cfg)
    if rope.get("rope_type", rope.get("type", "default")) != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
        return f"RoPE {rope}"
    if cfg.get("hidden_act", "silu") != "silu":
        return f"activation {cfg.get('hidden_act')!r}"
    if cfg.get("pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if not (root / SINGLE_FILE).is_file() and not (root / INDEX).is_file():
        return "no safetensors weights"
    return None


def _rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The RoPE parameters of a config.json (transformers 5's ``rope_parameters``, or 4's ``rope_theta`` and
    ``rope_scaling``)."""
    return cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000.0), **(cfg.get("rope_scaling") or {})}


class _Linear(nn.Linear):
    """A projection whose weights come from the checkpoint: no random init (on the meta device torch's init would
    import dynamo, the cost this model avoids)."""

    def reset_parameters(self) -> None:
        pass


class _Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.empty(size, device="meta")), eps


class _Rotary(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # not in state_dict, as in transformers
        self.attention_scaling = 1.0


class _Attention(nn.Module):
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, biases: set[str]) -> None:
        super().__init__()
        self.head_dim, self.scaling = head_dim, head_dim**-0.5
        sizes = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
                 "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden)}
        for name, (n_in, n_out) in sizes.items():
            setattr(self, name, _Linear(n_in, n_out, bias=name in biases, device="meta"))


class _MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = _Linear(hidden, intermediate, bias=False, device="meta")
        self.up_proj = _Linear(hidden, intermediate, bias=False, device="meta")
        self.down_proj = _Linear(intermediate, hidden, bias=False, device="meta")


class _Layer(nn.Module):
    def __init__(self, cfg: SimpleNamespace, biases: set[str]) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.self_attn = _Attention(cfg.hidden_size, self.heads, self.kv_heads, cfg.head_dim, biases)
        self.mlp = _MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The block over a whole sequence (a module call of its own: FSDP2 gathers its shards around it)."""
        attn, (b, t, _) = self.self_attn, hidden.shape
        x = rms_norm(hidden, self.input_layernorm)
        q = rotate(heads(attn.q_proj, x, self.heads, attn.head_dim), cos, sin)
        k = rotate(heads(attn.k_proj, x, self.kv_heads, attn.head_dim), cos, sin)
        out = F.scaled_dot_product_attention(q, k, heads(attn.v_proj, x, self.kv_heads, attn.head_dim),
                                             attn_mask=mask, scale=attn.scaling, enable_gqa=True)
        hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        return hidden + mlp(self.mlp, rms_norm(hidden, self.post_attention_layernorm))


class _Body(nn.Module):
    def __init__(self, cfg: SimpleNamespace, rope_theta: float, biases: set[str]) -> None:
        super().__init__()
        # padding_idx as transformers sets it: the pad token's embedding takes no gradient
        self.embed_tokens = _Embedding(cfg.vocab_size, cfg.hidden_size, getattr(cfg, "pad_token_id", None),
                                       device="meta")
        self.layers = nn.ModuleList(_Layer(cfg, biases) for _ in range(cfg.num_hidden_layers))
        self.norm = _RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = _Rotary(cfg.head_dim, rope_theta)


class CausalLMOutput(NamedTuple):
    """`LeanLlama`'s output (a named tuple: FSDP2 and autograd hooks find the tensor in it)."""

    logits: torch.Tensor


class LeanLlama(nn.Module):
    """transformers' ``<Llama|Qwen2|Mistral>ForCausalLM`` parameters under the same names, decoded by
    `LlamaDecoder` (`decoder`) and run whole, with gradients, by `forward`."""

    base_model_prefix = "model"  # where `toolbox.learner.strategy.decoder_layers` finds the blocks

    def __init__(self, config: dict[str, Any], biases: set[str]) -> None:
        super().__init__()
        cfg = SimpleNamespace(**{"rms_norm_eps": 1e-6, "tie_word_embeddings": False, **config})
        cfg.head_dim = config.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads
        cfg._attn_implementation = "sdpa"
        self.config = cfg
        self.model = _Body(cfg, float(_rope(config)["rope_theta"]), biases)
        self.lm_head = _Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device="meta")
        self.checkpointing = False

    def tie(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def decoder(self, batch: int, max_len: int) -> LlamaDecoder:
        """The lean loop's decoder over this model (weights column-major on a CPU: `column_major_weights`)."""
        from toolbox.engines.llama_decode import LlamaDecoder, column_major_weights

        column_major_weights(self)  # type: ignore[arg-type]  # what it reads of a transformers model, this has
        return LlamaDecoder(self, batch, max_len)  # type: ignore[arg-type]  # reads what it reads of a transformers model

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        """Recompute each block's activations in backward (torch's non-reentrant checkpoint, as transformers'
        switch of the same name; ``use_reentrant`` is the one keyword taken)."""
        kwargs = gradient_checkpointing_kwargs or {}
        if kwargs.get("use_reentrant", False):
            raise ValueError("the lean Llama model checkpoints its blocks with use_reentrant=False only")
        self.checkpointing = True

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, logits_to_keep: int = 0, **_: Any) -> CausalLMOutput:
        """Logits ``[B, T, V]`` (the last ``logits_to_keep`` positions when given), as transformers' forward takes
        its inputs: a 2-D padding mask (left-padded rows), a prepared 4-D mask (boolean, or additive), or none with
        ``position_ids`` that restart at each packed sequence. Positions count from 0 at the first column unless
        ``position_ids`` says otherwise."""
        b, t = input_ids.shape
        pos = torch.arange(t, device=input_ids.device).expand(b, t) if position_ids is None else position_ids
        if attention_mask is None:
            mask = packed_mask(pos)
        elif attention_mask.dim() == 2:
            mask = padding_mask(attention_mask)
        else:
            mask = attention_mask
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = rope(pos, self.model.rotary_emb.inv_freq, self.model.rotary_emb.attention_scaling, hidden.dtype)
        run: Any = nn.Module.__call__
        if self.checkpointing and self.training and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            run = partial(checkpoint, use_reentrant=False)
        for layer in self.model.layers:
            hidden = run(layer, hidden, cos, sin, mask)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        return CausalLMOutput(self.lm_head(rms_norm(hidden, self.model.norm)))

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, head: nn.Module) -> None:
        self.lm_head = head  # type: ignore[assignment]


def lean_or(fallback: Callable[[str, str], nn.Module]) -> Callable[[str, str], nn.Module]:
    """A loader that builds a `LeanLlama` from a directory `lean_unsupported` accepts, and ``fallback``'s model from
    any other, or where the weights turn out not to fit the module the config describes (said in a warning): the one
    rule the engines and the learners load by."""

    def load(path: str, dtype: str = "float32") -> nn.Module:
        if lean_unsupported(path) is None:
            try:
                return load_lean_llama(path, dtype)
            except ValueError as err:
                log.warning("%s; loading it with the fallback loader (transformers' model) instead", err)
        return fallback(path, dtype)

    return load


def load_lean_llama(path: str | Path, dtype: str = "float32") -> LeanLlama:
    """The model saved at ``path`` (which `lean_unsupported` accepts) as a `LeanLlama` in ``dtype``."""
    from safetensors.torch import load_file

    root = Path(path)
    config = json.loads((root / "config.json").read_text())
    if (root / INDEX).is_file():
        files = sorted(set(json.loads((root / INDEX).read_text())["weight_map"].values()))
    else:
        files = [SINGLE_FILE]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(root / name))
    biases = {key.split(".")[-2] for key in state if key.endswith("_proj.bias")}
    model = LeanLlama(config, biases)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    target = getattr(torch, dtype)
    state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
    expected = {k for k in model.state_dict() if not (model.config.tie_word_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(f"{root}: weights do not match a {config.get('model_type')} model: missing "
                         f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    model.tie()
    return model
