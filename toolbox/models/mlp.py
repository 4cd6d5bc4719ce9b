"""`ActorCritic`: separate MLP policy and value networks, on vector observations or a shared CNN's features.

The action head is categorical for a ``Discrete`` action space and a diagonal
Gaussian for a 1-D ``Box``, whose log-std is either a learned vector independent of
the state (``log_std: parameter``, cleanrl's and SB3's default) or a second output of
the actor network (``state_dependent``, clamped to ``log_std_bounds``). Gaussian
actions are sampled unbounded (their log-prob is that of the raw sample) and clipped
to the space only on their way into the env (`env_actions`). Image observations go
through a small CNN (``encoder: cnn``, `toolbox.models.cnn`) whose features feed both MLPs.

The module also holds the observation-normalisation and reward-scale statistics as
buffers, so one state dict carries everything the runners and a checkpoint need.
`SpaceSpec` is what the networks are built from; `toolbox.envs.make.spec_of` reads it
off a gymnasium env, so this module needs neither gymnasium nor the env code.
Not covered: recurrent policies, squashed (tanh) Gaussians.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn
from torch.distributions import Categorical, Distribution, Normal

from toolbox.models.cnn import CNNConfig, CNNEncoder
from toolbox.models.running_stats import RunningMeanStd

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class SpaceSpec:
    """What the policy needs to know about an env's spaces (plain numbers, cheap to pickle)."""

    obs_dim: int
    action_kind: Literal["discrete", "continuous"]
    action_dim: int  # number of actions (discrete) or action dimensions (continuous)
    action_start: int = 0  # Discrete(n, start=k): the env's first action id
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    obs_shape: tuple[int, ...] = ()  # before flattening (an image: H, W, C); empty: (obs_dim,)
    pixel_scale: float = 1.0  # what a CNN multiplies observations by (1/255 for uint8 images)


class PolicyConfig(BaseModel):
    """The policy and value networks and their input normalisation."""

    model_config = ConfigDict(extra="forbid")
    hidden_sizes: list[int] = Field(default_factory=lambda: [64, 64], description="Hidden layer widths of each MLP.")
    activation: Literal["tanh", "relu"] = Field("tanh", description="Hidden-layer activation.")
    init_log_std: float = Field(0.0, description="Initial log standard deviation of a Gaussian policy.")
    log_std: Literal["parameter", "state_dependent"] = Field(
        "parameter", description="Gaussian log-std: 'parameter', a learned vector independent of the state; or "
        "'state_dependent', a second output head of the actor network, clamped to log_std_bounds.")
    log_std_bounds: tuple[float, float] = Field((-5.0, 2.0), description="Clamp of a state-dependent log-std (min, max).")
    encoder: Literal["mlp", "cnn"] = Field(
        "mlp", description="Observation encoder: 'mlp' feeds the flattened observation to both MLPs; 'cnn' reads an "
        "image observation (H, W, C) with a small conv net shared by the policy and value heads (see `cnn`).")
    cnn: CNNConfig = Field(default_factory=CNNConfig, description="The conv layers when encoder is 'cnn'.")
    orthogonal_init: bool = Field(True, description="Orthogonal weights (gain sqrt(2) in hidden layers, 0.01 in the "
                                  "policy head, 1 in the value head) and zero biases; false: PyTorch's default init.")
    normalize_obs: bool = Field(False, description="Normalise observations by running mean/std (saved with the weights).")
    obs_clip: float = Field(10.0, gt=0, description="Clip normalised observations to [-obs_clip, obs_clip].")

    @field_validator("log_std_bounds")
    @classmethod
    def _ordered(cls, bounds: tuple[float, float]) -> tuple[float, float]:
        if bounds[0] >= bounds[1]:
            raise ValueError(f"log_std_bounds must be (min, max) with min < max; got {bounds}")
        return bounds


def mlp(sizes: list[int], activation: str, out_gain: float | None) -> nn.Sequential:
    """Linear layers with orthogonal init (gain sqrt(2) hidden, ``out_gain`` last) and zero biases
    (``out_gain=None``: PyTorch's default init)."""
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = i == len(sizes) - 2
        linear = nn.Linear(n_in, n_out)
        if out_gain is not None:
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
        self.state_dependent_std = not self.discrete and cfg.log_std == "state_dependent"
        self.encoder: nn.Module = nn.Identity()  # no parameters: an MLP policy's state dict is unchanged
        in_dim = spec.obs_dim
        if cfg.encoder == "cnn":
            self.encoder = CNNEncoder(spec.obs_shape or (spec.obs_dim,), cfg.cnn, spec.pixel_scale)
            in_dim = self.encoder.out_dim
        out_dim = spec.action_dim * (2 if self.state_dependent_std else 1)
        ortho = cfg.orthogonal_init
        self.actor = mlp([in_dim, *cfg.hidden_sizes, out_dim], cfg.activation, out_gain=0.01 if ortho else None)
        self.critic = mlp([in_dim, *cfg.hidden_sizes, 1], cfg.activation, out_gain=1.0 if ortho else None)
        if self.state_dependent_std:  # starts near init_log_std everywhere (the head's weights are tiny)
            head = self.actor[-1]
            assert isinstance(head, nn.Linear)
            with torch.no_grad():
                head.bias[spec.action_dim:] = cfg.init_log_std
        elif not self.discrete:
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), cfg.init_log_std))
        self.obs_rms = RunningMeanStd((spec.obs_dim,))
        self.ret_rms = RunningMeanStd(())

    # ---- the networks -------------------------------------------------------------------------
    def distribution(self, obs_BO: torch.Tensor) -> Distribution:
        """The action distribution; a Gaussian's log-prob/entropy are per dimension (sum them)."""
        return self._distribution(self.encoder(obs_BO))

    def value(self, obs_BO: torch.Tensor) -> torch.Tensor:
        return self.critic(self.encoder(obs_BO)).squeeze(-1)

    def _distribution(self, feat_BF: torch.Tensor) -> Distribution:
        out = self.actor(feat_BF)
        if self.discrete:
            return Categorical(logits=out, validate_args=False)
        mean_BA, log_std_BA = self._gaussian(out)
        return Normal(mean_BA, log_std_BA.exp(), validate_args=False)

    def _gaussian(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's output -> the Gaussian's ``(mean_BA, log_std_BA)``."""
        if self.state_dependent_std:
            mean, log_std = out.chunk(2, dim=-1)
            return mean, log_std.clamp(*self.cfg.log_std_bounds)
        return out, self.log_std.expand_as(out)

    def _heads(self, obs_BO: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """The distribution and ``value_B``, encoding the observations once."""
        feat_BF = self.encoder(obs_BO)
        return self._distribution(feat_BF), self.critic(feat_BF).squeeze(-1)

    def forward(self, obs_BO: torch.Tensor, actions_BA: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logp_B, entropy_B, value_B)`` of given actions: the learner's one pass (DDP syncs through it)."""
        dist, value_B = self._heads(obs_BO)
        return self._reduce(dist.log_prob(actions_BA)), self._reduce(dist.entropy()), value_B

    @torch.no_grad()
    def act(self, obs_BO: torch.Tensor, deterministic: bool = False,
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(actions, logp_B, value_B)``; ``deterministic`` takes the mode (argmax / mean).

        Sampling draws from ``generator`` (not the global RNG), so a runner's actions
        depend on its own seed only. A Gaussian is sampled and scored without a
        ``torch.distributions`` object (this runs once per env step: the object's
        argument broadcasting costs a third of the policy's time on a small MLP); the
        actions are the same, the log-prob is ``Normal.log_prob``'s up to rounding.
        """
        feat_BF = self.encoder(obs_BO)
        value_B = self.critic(feat_BF).squeeze(-1)
        if self.discrete:
            dist = self._distribution(feat_BF)
            assert isinstance(dist, Categorical)
            probs = dist.probs
            actions = probs.argmax(-1) if deterministic else torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            return actions, dist.log_prob(actions), value_B
        mean_BA, log_std_BA = self._gaussian(self.actor(feat_BF))
        noise_BA = torch.zeros_like(mean_BA) if deterministic else torch.randn(mean_BA.shape, generator=generator)
        actions = mean_BA + log_std_BA.exp() * noise_BA
        return actions, (-0.5 * noise_BA.square() - log_std_BA - HALF_LOG_2PI).sum(-1), value_B

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
