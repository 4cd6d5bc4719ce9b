"""PPO for gymnasium envs: the algorithm section (`PPOEnvConfig`) and the actor-critic loss.

The clipped surrogate is `toolbox.objectives.policy`'s (one source for the policy
math); this module adds the clipped value loss and the entropy bonus. One sample is
one env step, so the ``[B, T]`` token shapes of the policy module become ``[B, 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from toolbox.models.mlp import PolicyConfig
from toolbox.objectives.policy import clipped_policy_terms
from toolbox.objectives.value import clipped_value_terms


class PPOEnvConfig(BaseModel):
    """The algorithm section of a classic-RL experiment (PPO on a gymnasium env)."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["ppo_env"] = Field("ppo_env", description="Algorithm: selects the trainer and recipe.")
    steps_per_env: int = Field(128, ge=1, description="Steps each env copy takes per training step (rollout length T).")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda (1: Monte Carlo returns, 0: one-step TD).")
    epochs: int = Field(4, ge=1, description="Passes over each rollout batch.")
    minibatches: int = Field(4, ge=1, description="Optimizer steps per epoch (the batch is shuffled and split).")
    clip: float = Field(0.2, gt=0, description="Policy ratio clip range: ratio in [1 - clip, 1 + clip].")
    value_clip: float = Field(0.2, ge=0, description="Clip value updates to +-value_clip around the old values (0: unclipped).")
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    ent_coef: float = Field(0.01, ge=0, description="Weight of the entropy bonus.")
    target_kl: float | None = Field(None, gt=0, description="Stop the epochs early once approx KL exceeds this (null: never).")
    normalize_advantages: bool = Field(True, description="Whiten advantages per minibatch.")
    scale_rewards: bool = Field(False, description="Divide rewards by the running std of the discounted return (saved with the weights).")
    reward_clip: float = Field(10.0, gt=0, description="Clip scaled rewards to [-reward_clip, reward_clip].")
    target_return: float | None = Field(None, description="Stop once `target_metric` reaches this (null: run to the budget).")
    target_metric: Literal["eval_return", "episode_return"] = Field(
        "eval_return", description="What target_return is compared with: the mean return of the last evaluation, or "
        "`episode_return`, the mean of the last `return_window` training episodes (RLlib's episode_return_mean).")
    eval_episodes: int = Field(20, ge=1, description="Episodes per evaluation (deterministic policy, fresh seeds), split over runners.")
    return_window: int = Field(100, ge=1, description="Training episodes the reported `episode_return` averages over.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="Policy/value networks and observation normalisation.")


def value_loss(values_B: torch.Tensor, old_values_B: torch.Tensor, returns_B: torch.Tensor, clip: float) -> torch.Tensor:
    """The mean of `clipped_value_terms` over a minibatch of env steps."""
    return clipped_value_terms(values_B, old_values_B, returns_B, clip).mean()


@dataclass
class PPOLossTerms:
    """The scalar loss and its detached parts (metrics)."""

    loss: torch.Tensor
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_frac: float


def ppo_env_loss(cfg: PPOEnvConfig, logp_B: torch.Tensor, old_logp_B: torch.Tensor, adv_B: torch.Tensor,
                 entropy_B: torch.Tensor, values_B: torch.Tensor, old_values_B: torch.Tensor,
                 returns_B: torch.Tensor) -> PPOLossTerms:
    """``policy + vf_coef * value - ent_coef * entropy`` on one minibatch of env steps."""
    pg_B1, clipped_B1 = clipped_policy_terms(logp_B.unsqueeze(1), old_logp_B.unsqueeze(1), adv_B, cfg.clip, cfg.clip)
    policy = pg_B1.mean()
    value = value_loss(values_B, old_values_B, returns_B, cfg.value_clip)
    entropy = entropy_B.mean()
    loss = policy + cfg.vf_coef * value - cfg.ent_coef * entropy
    with torch.no_grad():
        log_ratio = logp_B - old_logp_B
        approx_kl = float((log_ratio.exp() - 1 - log_ratio).mean())  # k3: unbiased, always >= 0
    return PPOLossTerms(loss, float(policy.detach()), float(value.detach()), float(entropy.detach()), approx_kl,
                        float(clipped_B1.mean()))
