"""A critic for language-model PPO: the policy's architecture without its LM head, plus a scalar head."""

from __future__ import annotations

import torch
from torch import nn

from toolbox.models.logprobs import ResponseRows


class ValueModel(nn.Module):
    """``V(prefix)`` for every position: a transformers backbone (``AutoModel``) and a zero-initialised linear head.

    ``base_model_prefix = "model"`` lets the FSDP2 strategy find and shard the decoder layers. The head takes the
    backbone's dtype: FSDP2 shards the root group (embeddings, final norm, head) as one flat group of one dtype.
    """

    base_model_prefix = "model"

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.model = backbone
        self.head = nn.Linear(hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False).last_hidden_state
        # In the head's compute dtype (bf16 under mixed precision, whatever the stored parameters are); the values
        # leave in fp32 for the losses.
        return self.head(hidden.to(self.head.weight.dtype)).float().squeeze(-1)


def load_value_model(path: str, dtype: str = "float32") -> ValueModel:
    """The critic, initialised from the policy's checkpoint (``AutoModel.from_pretrained``) with a fresh head."""
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(path, dtype=getattr(torch, dtype))
    return ValueModel(backbone, backbone.config.hidden_size)


def response_values(critic: nn.Module, batch: ResponseRows) -> torch.Tensor:
    """``V`` of the state before each response token, ``[B, R]`` (0 at padding)."""
    ids, attn, position_ids = batch.model_inputs()
    values = critic(input_ids=ids, attention_mask=attn, position_ids=position_ids).to(batch.response_mask_BR.device)
    p = batch.prompt_ids_BP.shape[1]
    return values[:, p - 1 : -1] * batch.response_mask_BR
