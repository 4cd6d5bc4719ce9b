"""Advantage estimators. These functions are the single source of this math.

Shapes: ``[B, G]`` is prompts x samples per prompt; ``[T, N]`` is time x envs.
"""

from __future__ import annotations

import torch

from toolbox.core.registry import Registry

EPS = 1e-6

ADVANTAGES: Registry = Registry("advantage")


def group_normalized(rewards: torch.Tensor, scale: bool = True, eps: float = EPS) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` within each group of ``rewards`` ``[B, G]`` (population std), or
    ``r - mean`` if not ``scale``. A group whose rewards are all equal gets zero advantage (no NaN)."""
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale:
        return centered
    return centered / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)


def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline on ``rewards`` ``[B, G]``: each reward minus the mean of the *other* samples
    of its group. A group of one has no other samples; its advantage is 0."""
    g = rewards.shape[1]
    if g < 2:
        return torch.zeros_like(rewards)
    others_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)
    return rewards - others_mean


def batch_normalized(rewards: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """REINFORCE++ on ``rewards`` ``[B, G]``: subtract the group mean, then whiten over the whole batch."""
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    return (centered - centered.mean()) / (centered.std(unbiased=False) + eps)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation on time-major ``[T, N]`` tensors.

    ``dones[t] = 1`` when the episode ended at step t: no bootstrap across it.
    ``last_value`` ``[N]`` is the value of the state after step T-1. Returns
    ``(advantages, returns)`` ``[T, N]`` with ``returns = advantages + values``.
    """
    adv_TN = torch.zeros_like(rewards)
    next_adv_N = torch.zeros_like(last_value)
    next_value_N = last_value
    for t in reversed(range(rewards.shape[0])):
        not_done_N = 1.0 - dones[t].to(rewards.dtype)
        delta_N = rewards[t] + gamma * next_value_N * not_done_N - values[t]
        next_adv_N = delta_N + gamma * lam * not_done_N * next_adv_N
        adv_TN[t] = next_adv_N
        next_value_N = values[t]
    return adv_TN, adv_TN + values


def grpo_advantages(rewards_B: torch.Tensor, group_size: int, estimator: str) -> torch.Tensor:
    """Per-sequence advantages from rewards laid out group by group (``[B*G]`` -> ``[B*G]``)."""
    if rewards_B.numel() % group_size:
        raise ValueError(f"{rewards_B.numel()} rewards do not split into groups of {group_size}")
    fn = ADVANTAGES.get(estimator).factory
    return fn(rewards_B.view(-1, group_size)).reshape(-1)


def overlong_shaping(lengths_B: torch.Tensor, max_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, to be added to rewards: 0 up to ``max_len - buffer``, then
    falling linearly to ``-penalty`` at ``max_len``."""
    if buffer <= 0:
        return torch.zeros(lengths_B.shape, dtype=torch.float32)
    over = (lengths_B.float() - (max_len - buffer)).clamp(min=0.0)
    return -penalty * (over / buffer).clamp(max=1.0)


ADVANTAGES.register("group_norm")(group_normalized)
ADVANTAGES.register("group_mean")(lambda rewards: group_normalized(rewards, scale=False))
ADVANTAGES.register("rloo")(rloo)
ADVANTAGES.register("reinforce_pp")(batch_normalized)
