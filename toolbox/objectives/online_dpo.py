"""Online DPO: preference pairs made on the fly from sampled groups (best vs worst response by reward).

It runs on the GRPO loop (rollout -> reward -> update -> sync); only the learner
differs, so `OnlineDPOConfig` extends `GRPOConfig`. The loss is `dpo_loss`.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator

from toolbox.objectives.families import check_objective
from toolbox.objectives.grpo import GRPOConfig


class OnlineDPOConfig(GRPOConfig):
    """The algorithm section of an online DPO experiment (``group_size`` >= 2 samples per prompt)."""

    name: Literal["online_dpo"] = Field("online_dpo", description="Algorithm: selects the trainer and recipe.")  # type: ignore[assignment]
    group_size: int = Field(4, ge=2, description="Samples per prompt; the best and worst by reward form a pair.")
    loss_type: str = Field("sigmoid", description="Preference loss: 'sigmoid' (DPO), 'ipo' or 'hinge'.")
    beta: float = Field(0.1, gt=0, description="Strength of the implicit KL to the frozen reference.")
    label_smoothing: float = Field(0.0, ge=0, le=0.5, description="Conservative DPO: probability a label is flipped (sigmoid only).")

    @field_validator("loss_type")
    @classmethod
    def _preference(cls, value: str) -> str:
        return check_objective(value, "preference", "online_dpo")


def best_worst_pairs(rewards_B: torch.Tensor, ok_B: torch.Tensor, group_size: int) -> tuple[torch.Tensor, ...]:
    """Per group: the row of its best and of its worst scored sample, and whether they differ.

    Returns ``(chosen_rows, rejected_rows, weight)``, each ``[groups]``; ``weight`` is 0 for a
    group with fewer than two scored samples or all-equal rewards (no preference to learn).
    """
    values = rewards_B.view(-1, group_size).float()
    ok = ok_B.view(-1, group_size)
    best = torch.where(ok, values, torch.tensor(float("-inf"))).argmax(dim=1)
    worst = torch.where(ok, values, torch.tensor(float("inf"))).argmin(dim=1)
    offset = torch.arange(values.shape[0]) * group_size
    gap = values.gather(1, best[:, None]).squeeze(1) - values.gather(1, worst[:, None]).squeeze(1)
    weight = ((ok.sum(dim=1) >= 2) & (gap > 0)).float()
    return offset + best, offset + worst, weight
