"""Reward-model loss: Bradley-Terry on the scalar scores of chosen and rejected responses. Per pair, ``[B]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(chosen_B: torch.Tensor, rejected_B: torch.Tensor, center_coef: float = 0.0) -> torch.Tensor:
    """``-log sigmoid(s_c - s_r)`` per pair (the negative log-likelihood that chosen wins), plus
    ``center_coef * (s_c + s_r)^2`` when asked (keeps the scores' scale anchored at 0)."""
    loss_B = -F.logsigmoid(chosen_B - rejected_B)
    return loss_B + center_coef * (chosen_B + rejected_B) ** 2 if center_coef else loss_B
