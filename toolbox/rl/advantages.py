"""Advantage estimators. These functions are the single source of this math.

Shapes: ``[B, G]`` is prompts x samples per prompt; ``[T, N]`` is time x envs.
"""

from __future__ import annotations

import torch

from toolbox.core.registry import Registry

EPS = 1e-6

ADVANTAGES: Registry = Registry("advantage")


def group_normalized(rewards_BG: torch.Tensor, scale: bool = True, eps: float = EPS) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` within each group (population std), or ``r - mean`` if not ``scale``.

    A group whose rewards are all equal gets zero advantage (no NaN).
    """
    centered = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    if not scale:
        return centered
    return centered / (rewards_BG.std(dim=1, unbiased=False, keepdim=True) + eps)


def rloo(rewards_BG: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: each sample's reward minus the mean of the *other* samples in its group.

    A group of one has no other samples; its advantage is 0.
    """
    g = rewards_BG.shape[1]
    if g < 2:
        return torch.zeros_like(rewards_BG)
    others_mean = (rewards_BG.sum(dim=1, keepdim=True) - rewards_BG) / (g - 1)
    return rewards_BG - others_mean


def batch_normalized(rewards_BG: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """REINFORCE++: subtract the group mean, then whiten over the whole batch."""
    centered = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    return (centered - centered.mean()) / (centered.std(unbiased=False) + eps)


def gae(
    rewards_TN: torch.Tensor,
    values_TN: torch.Tensor,
    dones_TN: torch.Tensor,
    last_value_N: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, time-major.

    ``dones_TN[t] = 1`` when the episode ended at step t: no bootstrap across it.
    ``last_value_N`` is the value of the state after step T-1. Returns
    ``(advantages_TN, returns_TN)`` with ``returns = advantages + values``.
    """
    t_len = rewards_TN.shape[0]
    adv_TN = torch.zeros_like(rewards_TN)
    next_adv_N = torch.zeros_like(last_value_N)
    next_value_N = last_value_N
    for t in reversed(range(t_len)):
        not_done_N = 1.0 - dones_TN[t].to(rewards_TN.dtype)
        delta_N = rewards_TN[t] + gamma * next_value_N * not_done_N - values_TN[t]
        next_adv_N = delta_N + gamma * lam * not_done_N * next_adv_N
        adv_TN[t] = next_adv_N
        next_value_N = values_TN[t]
    return adv_TN, adv_TN + values_TN


ADVANTAGES.register("group_norm")(group_normalized)
ADVANTAGES.register("group_mean")(lambda rewards_BG: group_normalized(rewards_BG, scale=False))
ADVANTAGES.register("rloo")(rloo)
ADVANTAGES.register("reinforce_pp")(batch_normalized)
