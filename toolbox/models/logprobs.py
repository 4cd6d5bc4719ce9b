"""Per-token log-probs: the one function engines, learners and supervised losses all use.

`token_logprobs` scores labels under logits already aligned with them; `response_logprobs`
runs a causal LM over prompt + response rows and scores the response tokens (what the
learners train on and what the ``hf`` engine reports as behaviour log-probs).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


def token_logprobs(logits_BTV: torch.Tensor, labels_BT: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits[b, t] / temperature)[labels[b, t]]``, ``[B, T]``, computed in float32.

    Computed where the logits are (a learner's GPU) and returned where the labels are (the batch's device),
    so only ``[B, T]`` values cross devices, never ``[B, T, V]`` logits.
    """
    logits = logits_BTV.float()
    if temperature != 1.0:
        logits = logits / temperature
    labels = labels_BT.to(logits.device).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, labels).squeeze(-1).to(labels_BT.device)


class ResponseRows(Protocol):
    """Left-padded prompts and right-padded responses (`toolbox.rl.batch.RolloutBatch` is one)."""

    prompt_ids_BP: torch.Tensor
    response_ids_BR: torch.Tensor
    response_mask_BR: torch.Tensor

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


def response_logprobs(model: nn.Module, rows: ResponseRows, temperature: float) -> torch.Tensor:
    """``log p(response token | prefix)`` at ``temperature`` for every response position, ``[B, R]`` (0 at padding)."""
    ids, attn, position_ids = rows.model_inputs()
    # Logits at the last R + 1 positions only (what TRL's logits_to_keep does): the output head skips the prompt,
    # a large share of the forward when the vocabulary is large (150k for Qwen2).
    r = rows.response_ids_BR.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False,
                   logits_to_keep=r + 1).logits
    return token_logprobs(logits[:, :-1], rows.response_ids_BR, temperature) * rows.response_mask_BR
