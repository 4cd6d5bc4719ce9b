"""Policy-gradient losses: PPO-style clipping at the token level."""

from __future__ import annotations

import torch

from toolbox.objectives.aggregate import Aggregation, aggregate


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: Aggregation = "token-mean",
    **agg_kwargs: float | None,
) -> torch.Tensor:
    """PPO clipped surrogate, ``-min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)``, aggregated.

    ``logp``/``old_logp``/``mask`` are ``[B, T]``; ``advantages`` is ``[B, T]`` or
    ``[B]`` (one advantage per sequence, broadcast over its tokens). Separate low and
    high clip ranges give DAPO's clip-higher.
    """
    loss_BT, _ = clipped_policy_terms(logp, old_logp, advantages, clip_low, clip_high)
    return aggregate(loss_BT, mask, agg, **agg_kwargs)


def clipped_policy_terms(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped loss and a 0/1 tensor of where the clip was active."""
    adv_BT = adv.unsqueeze(-1).expand_as(logp_BT) if adv.dim() == 1 else adv
    ratio_BT = torch.exp(logp_BT - old_logp_BT)
    unclipped = ratio_BT * adv_BT
    clipped = ratio_BT.clamp(1.0 - clip_low, 1.0 + clip_high) * adv_BT
    loss_BT = -torch.minimum(unclipped, clipped)
    return loss_BT, (clipped < unclipped).to(logp_BT.dtype)
