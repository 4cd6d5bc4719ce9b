"""PPO for gymnasium envs: the actor-critic loss.

The clipped surrogate is `toolbox.objectives.policy`'s (one source for the policy
math); this module adds the clipped value loss and the entropy bonus. One sample is
one env step, so the ``[B, T]`` token shapes of the policy module become ``[B, 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolbox.objectives.policy import clipped_policy_terms
from toolbox.objectives.registry import ValueLoss
from toolbox.objectives.value import clipped_value_terms


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


def ppo_env_loss(logp_B: torch.Tensor, old_logp_B: torch.Tensor, adv_B: torch.Tensor, entropy_B: torch.Tensor,
                 values_B: torch.Tensor, old_values_B: torch.Tensor, returns_B: torch.Tensor, *, clip: float,
                 value_fn: ValueLoss, vf_coef: float, ent_coef: float) -> PPOLossTerms:
    """``policy + vf_coef * value - ent_coef * entropy`` on one minibatch of env steps; ``value`` is the mean of
    ``value_fn`` (the config's value loss, `toolbox.objectives.registry.VALUE_LOSSES`) over the steps."""
    pg_B1, clipped_B1 = clipped_policy_terms(logp_B.unsqueeze(1), old_logp_B.unsqueeze(1), adv_B, clip, clip)
    policy = pg_B1.mean()
    value = value_fn(values_B, old_values_B, returns_B).mean()
    entropy = entropy_B.mean()
    loss = policy + vf_coef * value - ent_coef * entropy
    with torch.no_grad():
        log_ratio = logp_B - old_logp_B
        approx_kl = float((log_ratio.exp() - 1 - log_ratio).mean())  # k3: unbiased, always >= 0
    return PPOLossTerms(loss, float(policy.detach()), float(value.detach()), float(entropy.detach()), approx_kl,
                        float(clipped_B1.mean()))
