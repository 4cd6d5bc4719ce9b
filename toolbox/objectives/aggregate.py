"""Reducing a ``[B, T]`` per-token loss to a scalar, the ways the GRPO family does it."""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def aggregate(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    agg: Aggregation = "token-mean",
    token_count: float | None = None,
    seq_count: float | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss over the tokens ``mask_BT`` selects.

    ``token_count`` / ``seq_count`` override the denominators, so a micro-batch can be
    normalised by the whole global batch (which makes gradient accumulation and data
    parallelism exact). ``norm_length`` is Dr. GRPO's constant length (defaults to T).
    An empty mask gives 0, never NaN.
    """
    mask = mask_BT.to(loss_BT.dtype)
    masked = loss_BT * mask
    if agg == "token-mean":
        denom = token_count if token_count is not None else mask.sum()
        return masked.sum() / max(float(denom), 1.0)
    seqs = seq_count if seq_count is not None else loss_BT.shape[0]
    if agg == "seq-mean-token-mean":
        per_seq = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    elif agg == "seq-mean-token-sum":
        per_seq = masked.sum(dim=1)
    elif agg == "seq-mean-token-sum-norm":
        per_seq = masked.sum(dim=1) / float(norm_length or loss_BT.shape[1])
    else:
        raise ValueError(f"unknown aggregation {agg!r}")
    return per_seq.sum() / max(float(seqs), 1.0)
