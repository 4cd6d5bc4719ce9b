"""Value-function losses, shared by PPO on language models (per token) and on gymnasium envs (per step); the
``clipped_mse`` value loss."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.objectives.registry import VALUE_LOSSES


def clipped_value_terms(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-element ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2)``; ``0.5 * (V - R)^2`` if ``clip`` is 0."""
    unclipped = (values - returns).pow(2)
    if clip <= 0:
        return 0.5 * unclipped
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum(unclipped, (clipped - returns).pow(2))


class ClippedMSE(BaseModel):
    """Half the squared error to the returns, the pessimistic side of a clipped and an unclipped update
    (`clipped_value_terms`)."""

    model_config = ConfigDict(extra="forbid")
    clip: float = Field(0.2, ge=0, description="Clip value updates to +-clip around the old values (0: unclipped).")

    def __call__(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        return clipped_value_terms(values, old_values, returns, self.clip)


VALUE_LOSSES.register("clipped_mse", config=ClippedMSE)(ClippedMSE)
