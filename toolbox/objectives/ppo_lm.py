"""PPO for language models with a critic: per-token rewards (score on the last token, KL on every token) and
token-level GAE. The policy and value losses are `clipped_policy_terms` and `clipped_value_terms`."""

from __future__ import annotations

import torch

from toolbox.rl.advantages import gae


def token_rewards(scores_B: torch.Tensor, mask_BT: torch.Tensor, kl_BT: torch.Tensor | None, kl_coef: float) -> torch.Tensor:
    """Per-token rewards: the sequence score on the last response token, minus ``kl_coef * KL`` on every token."""
    rewards_BT = torch.zeros(mask_BT.shape, dtype=torch.float32)
    last_B = (mask_BT.sum(dim=1) - 1).clamp(min=0)
    rewards_BT[torch.arange(mask_BT.shape[0]), last_B] = scores_B.float()
    if kl_BT is not None and kl_coef > 0:
        rewards_BT = rewards_BT - kl_coef * kl_BT
    return rewards_BT * mask_BT


def token_gae(rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float,
              lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over each response's tokens (the episode ends at its last token; no bootstrap after it).

    Returns ``(advantages_BT, returns_BT)``, 0 at padding.
    """
    last_B = (mask_BT.sum(dim=1) - 1).clamp(min=0)
    dones_BT = torch.zeros_like(rewards_BT)
    dones_BT[torch.arange(mask_BT.shape[0]), last_B] = 1.0
    adv_TB, ret_TB = gae(rewards_BT.T, values_BT.T, dones_BT.T, torch.zeros(mask_BT.shape[0]), gamma, lam)
    return adv_TB.T * mask_BT, ret_TB.T * mask_BT

