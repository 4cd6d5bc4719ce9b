"""Advantage estimators. These functions are the single source of this math.

Shapes: ``[B, G]`` is prompts x samples per prompt; ``[T, N]`` is time x envs.
"""

from __future__ import annotations

import torch

from toolbox.core.registry import Registry

EPS = 1e-6
SPREAD_TOL = 1e-6  # a group's rewards within this relative spread are equal (float rounding, not signal)

ADVANTAGES: Registry = Registry("advantage")


def within_noise(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """Whether rewards spread from ``lo`` to ``hi`` are equal up to float rounding (relative to their size),
    elementwise; an empty group (``hi`` -inf, ``lo`` inf) counts as equal."""
    return ~((hi - lo) > SPREAD_TOL * torch.maximum(hi.abs(), lo.abs()).clamp(min=1.0))


def usable(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Which samples of ``rewards`` ``[B, G]`` enter the group statistics: the ``valid`` ones (default: all)
    in groups with at least two of them. A group with fewer has no baseline, so it contributes nothing."""
    ok = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    return ok & (ok.sum(dim=1, keepdim=True) >= 2)


def _centered(rewards: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(r - group mean, count)`` over the ``ok`` samples of each group, in float64; 0 outside ``ok`` and in
    a group whose spread is within float noise (eight rewards of 0.7 are equal, not 1e-8 apart)."""
    r = rewards.double()
    count = ok.sum(dim=1, keepdim=True).clamp(min=1)
    mean = (r * ok).sum(dim=1, keepdim=True) / count
    hi = torch.where(ok, r, -torch.inf).amax(dim=1, keepdim=True)
    lo = torch.where(ok, r, torch.inf).amin(dim=1, keepdim=True)
    flat = within_noise(hi, lo)  # also true for a group with no usable sample
    return torch.where(ok & ~flat, r - mean, 0.0), count


def group_normalized(rewards: torch.Tensor, valid: torch.Tensor | None = None, scale: bool = True,
                     eps: float = EPS) -> torch.Tensor:
    """``(r - mean) / (std + eps)`` within each group of ``rewards`` ``[B, G]`` (population std over its
    `usable` samples), or ``r - mean`` if not ``scale``. Samples outside ``valid`` get 0 and do not count;
    a group whose rewards are all equal (within float noise) gets zero advantage (no NaN)."""
    centered, count = _centered(rewards, usable(rewards, valid))
    if scale:
        centered = centered / ((centered.square().sum(dim=1, keepdim=True) / count).sqrt() + eps)
    return centered.to(rewards.dtype)


def rloo(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Leave-one-out baseline on ``rewards`` ``[B, G]``: each reward minus the mean of the *other* usable
    samples of its group, which is ``n / (n - 1)`` times the group-centred reward for ``n`` usable samples.
    A group with fewer than two has no other samples; its advantage is 0."""
    centered, count = _centered(rewards, usable(rewards, valid))
    return (centered * count / (count - 1).clamp(min=1)).to(rewards.dtype)


def batch_normalized(rewards: torch.Tensor, valid: torch.Tensor | None = None, eps: float = EPS) -> torch.Tensor:
    """REINFORCE++ on ``rewards`` ``[B, G]``: subtract the group mean, then whiten over the usable samples of
    the whole batch (the others get 0)."""
    ok = usable(rewards, valid)
    centered, _ = _centered(rewards, ok)
    n = ok.sum().clamp(min=1)
    mean = centered.sum() / n
    std = (torch.where(ok, centered - mean, 0.0).square().sum() / n).sqrt()
    return torch.where(ok, (centered - mean) / (std + eps), 0.0).to(rewards.dtype)


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


def grpo_advantages(rewards_B: torch.Tensor, group_size: int, estimator: str,
                    valid_B: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence advantages from rewards laid out group by group (``[B*G]`` -> ``[B*G]``), and which samples
    were `usable` (``valid_B`` ones in groups with two or more): only those belong in the loss and its
    normalisers; the others' advantage is 0."""
    if rewards_B.numel() % group_size:
        raise ValueError(f"{rewards_B.numel()} rewards do not split into groups of {group_size}")
    fn = ADVANTAGES.get(estimator).factory
    rewards_BG = rewards_B.view(-1, group_size)
    valid_BG = None if valid_B is None else valid_B.view(-1, group_size)
    return fn(rewards_BG, valid_BG).reshape(-1), usable(rewards_BG, valid_BG).reshape(-1)


def overlong_shaping(lengths_B: torch.Tensor, max_len: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment, to be added to rewards: 0 up to ``max_len - buffer``, then
    falling linearly to ``-penalty`` at ``max_len``."""
    if buffer <= 0:
        return torch.zeros(lengths_B.shape, dtype=torch.float32)
    over = (lengths_B.float() - (max_len - buffer)).clamp(min=0.0)
    return -penalty * (over / buffer).clamp(max=1.0)


ADVANTAGES.register("group_norm")(group_normalized)
ADVANTAGES.register("group_mean")(lambda rewards, valid=None: group_normalized(rewards, valid, scale=False))
ADVANTAGES.register("rloo")(rloo)
ADVANTAGES.register("reinforce_pp")(batch_normalized)
