"""Value-function losses, shared by PPO on language models (per token) and on gymnasium envs (per step)."""

from __future__ import annotations

import torch


def clipped_value_terms(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-element ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, +-clip) - R)^2)``; ``0.5 * (V - R)^2`` if ``clip`` is 0."""
    unclipped = (values - returns).pow(2)
    if clip <= 0:
        return 0.5 * unclipped
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum(unclipped, (clipped - returns).pow(2))
