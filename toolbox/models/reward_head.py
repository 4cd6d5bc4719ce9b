"""A scalar reward head on a causal LM: ``AutoModelForSequenceClassification`` with one label.

`load_reward_model` reads a causal LM directory (its head is then new) or a trained reward model (a
directory `algorithm.name=rm` exported). A new head is initialised from a fixed seed, so every learner rank
starts from the same weights without a broadcast. `sequence_scores` is the one forward both the ``rm`` learner
and the ``reward_model`` reward use: transformers pools the logit of each row's last token that is not the
pad token, so rows are right-padded with the pad id the model's config names (set here from the tokenizer).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from toolbox.data.packing import TokenBatch

HEAD_SEED = 0


def load_reward_model(path: str, dtype: str = "float32", pad_token_id: int | None = None,
                      trust_remote_code: bool = False) -> Any:
    """``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)`` in ``dtype``; a head missing from
    ``path`` is initialised as TRL's reward trainer does (normal, std 1/sqrt(hidden+1)), from a fixed seed."""
    from transformers import AutoModelForSequenceClassification

    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code,
        output_loading_info=True)
    missing = set(info.get("missing_keys", ()))
    head = _head(model)
    if any(name.startswith(_head_name(model)) for name in missing):
        gen = torch.Generator().manual_seed(HEAD_SEED)
        with torch.no_grad():
            std = 1.0 / math.sqrt(model.config.hidden_size + 1)
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * std)
            if getattr(head, "bias", None) is not None:
                head.bias.zero_()
    if pad_token_id is None:  # the pooling needs it; take the tokenizer's (load_tokenizer guarantees one)
        from toolbox.models.loading import load_tokenizer

        pad_token_id = int(load_tokenizer(path, trust_remote_code).pad_token_id)
    model.config.pad_token_id = pad_token_id
    return model


def _head_name(model: Any) -> str:
    return "score" if hasattr(model, "score") else "classifier"


def _head(model: Any) -> nn.Linear:
    head = getattr(model, _head_name(model), None)
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear `score` head; a reward model needs one "
                         "(AutoModelForSequenceClassification of a decoder-only LM)")
    return head


def sequence_scores(model: nn.Module, batch: TokenBatch, device: torch.device | None = None) -> torch.Tensor:
    """One scalar per row of an unpacked, right-padded batch, ``[B]`` (inputs moved to ``device`` when given)."""
    if batch.packed:
        raise ValueError("sequence_scores needs one sequence per row (pad_examples), not packed rows")
    ids_BT, mask_BT = batch.input_ids_BT, batch.attention_mask_BT
    if device is not None:
        ids_BT, mask_BT = ids_BT.to(device), mask_BT.to(device) if mask_BT is not None else None
    out = model(input_ids=ids_BT, attention_mask=mask_BT, use_cache=False)
    return out.logits[:, 0].float()
