"""`ActorCritic`: separate MLP policy and value networks for vector observations.

The action head is categorical for a ``Discrete`` action space and a diagonal
Gaussian with a state-independent, learned log-std for a 1-D ``Box``. Gaussian
actions are sampled unbounded (their log-prob is that of the raw sample) and clipped
to the space only on their way into the env (`env_actions`).

The module also holds the observation-normalisation and reward-scale statistics as
buffers, so one state dict carries everything the runners and a checkpoint need.
`SpaceSpec` is what the networks are built from; `toolbox.envs.make.spec_of` reads it
off a gymnasium env, so this module needs neither gymnasium nor the env code.
Not covered: image observations (no CNN), recurrent policies, squashed (tanh) Gaussians.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.distributions import Categorical, Distribution, Normal

from toolbox.models.running_stats import RunningMeanStd


@dataclass(frozen=True)
class SpaceSpec:
    """What the policy needs to know about an env's spaces (plain numbers, cheap to pickle)."""

    obs_dim: int
    action_kind: Literal["discrete", "continuous"]
    action_dim: int  # number of actions (discrete) or action dimensions (continuous)
    action_start: int = 0  # Discrete(n, start=k): the env's first action id
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()


class PolicyConfig(BaseModel):
    """The policy and value networks and their input normalisation."""

    model_config = ConfigDict(extra="forbid")
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64], description="Hidden layer widths of each MLP.")
    activation: Literal["tanh", "relu"] = Field("tanh", description="Hidden-layer activation.")
    init_log_std: float = Field(0.0, description="Initial log standard deviation of a Gaussian policy.")
    normalize_obs: bool = Field(False, description="Normalise observations by running mean/std (saved with the weights).")
    obs_clip: float = Field(10.0, gt=0, description="Clip normalised observations to [-obs_clip, obs_clip].")


def mlp(sizes: list[int], activation: str, out_gain: float) -> nn.Sequential:
    """Linear layers with orthogonal init (gain sqrt(2) hidden, ``out_gain`` last) and zero biases."""
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = i == len(sizes) - 2
        linear = nn.Linear(n_in, n_out)
        nn.init.orthogonal_(linear.weight, gain=out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear] if last else [linear, act()]
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Policy ``pi(a | s)`` and value ``V(s)`` on flattened (optionally normalised) observations."""

    def __init__(self, spec: SpaceSpec, cfg: PolicyConfig) -> None:
        super().__init__()
        self.spec, self.cfg = spec, cfg
        self.discrete = spec.action_kind == "discrete"
        self.actor = mlp([spec.obs_dim, *cfg.hidden_sizes, spec.action_dim], cfg.activation, out_gain=0.01)
        self.critic = mlp([spec.obs_dim, *cfg.hidden_sizes, 1], cfg.activation, out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), cfg.init_log_std))
        self.obs_rms = RunningMeanStd((spec.obs_dim,))
        self.ret_rms = RunningMeanStd(())

    # ---- the networks -------------------------------------------------------------------------
    def distribution(self, obs_BO: torch.Tensor) -> Distribution:
        """The action distribution; a Gaussian's log-prob/entropy are per dimension (sum them)."""
        out = self.actor(obs_BO)
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def value(self, obs_BO: torch.Tensor) -> torch.Tensor:
        return self.critic(obs_BO).squeeze(-1)

    def forward(self, obs_BO: torch.Tensor, actions_BA: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logp_B, entropy_B, value_B)`` of given actions: the learner's one pass (DDP syncs through it)."""
        dist = self.distribution(obs_BO)
        return self._reduce(dist.log_prob(actions_BA)), self._reduce(dist.entropy()), self.value(obs_BO)

    @torch.no_grad()
    def act(self, obs_BO: torch.Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(actions, logp_B, value_B)``; ``deterministic`` takes the mode (argmax / mean).

        Sampling draws from ``generator`` (not the global RNG), so a runner's actions
        depend on its own seed only.
        """
        dist = self.distribution(obs_BO)
        if isinstance(dist, Categorical):
            probs = dist.probs
            actions = probs.argmax(-1) if deterministic else torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        elif deterministic:
            actions = dist.mean
        else:
            actions = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator)
        return actions, self._reduce(dist.log_prob(actions)), self.value(obs_BO)

    def _reduce(self, per_dim: torch.Tensor) -> torch.Tensor:
        return per_dim if self.discrete else per_dim.sum(-1)

    # ---- the env side ---------------------------------------------------------------------------
    def prepare_obs(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Raw env observations ``[B, ...]`` -> flattened float32 ``[B, obs_dim]``, normalised if configured."""
        obs_BO = torch.as_tensor(obs, dtype=torch.float32).reshape(-1, self.spec.obs_dim)
        return self.obs_rms.normalize(obs_BO, self.cfg.obs_clip) if self.cfg.normalize_obs else obs_BO

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Policy actions -> what the env accepts: ids offset by the space's start, or clipped to the Box."""
        if self.discrete:
            return actions.numpy().astype(np.int64) + self.spec.action_start
        low, high = np.asarray(self.spec.low, np.float32), np.asarray(self.spec.high, np.float32)
        return np.clip(actions.numpy().astype(np.float32), low, high)
