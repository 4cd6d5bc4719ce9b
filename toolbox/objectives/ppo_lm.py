"""PPO for language models with a critic: token-level GAE, clipped policy and value losses, KL in reward or loss.

The algorithm shares the GRPO trainer's loop (rollout -> reward -> update -> sync);
only the learner differs, so `PPOConfig` extends `GRPOConfig` rather than copying it.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from toolbox.objectives.grpo import GRPOConfig
from toolbox.rl.advantages import gae


class PPOConfig(GRPOConfig):
    """The algorithm section of a language-model PPO experiment (``group_size`` may be 1)."""

    name: Literal["ppo"] = Field("ppo", description="Algorithm: selects the trainer and recipe.")  # type: ignore[assignment]
    group_size: int = Field(1, ge=1, description="Completions per prompt (PPO needs no groups).")
    ppo_epochs: int = Field(2, ge=1, description="Passes over each rollout batch.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount over response tokens.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda over response tokens.")
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    value_clip: float = Field(0.2, ge=0, description="Clip value updates to +-value_clip around the old values (0: off).")
    kl_in_reward: bool = Field(True, description="Subtract kl_coef * KL per token from the reward (else: a loss term).")
    critic_lr: float = Field(1e-3, gt=0, description="Learning rate of the critic.")
    whiten_advantages: bool = Field(True, description="Normalise advantages over the batch's response tokens.")


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

