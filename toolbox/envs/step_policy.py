"""The policy as an env runner calls it once per env step: `ActorCritic.act` in numpy for MLP policies.

An env runner calls the policy once per vector step on a handful of observations (8 rows of 17 numbers for
HalfCheetah with 8 copies). At that size a torch op costs a few microseconds of dispatch whatever it computes,
and ``prepare_obs`` + ``act`` + ``env_actions`` are some 40 of them: about 150 us per vector step on a
2-core CPU, against about 40 us for the same arithmetic in numpy (`toolbox bench env_throughput` prints both
first, from `toolbox.bench._step_breakdown`). `NumpyStepPolicy` is that arithmetic: the same layers, normalisation, sampling and log-prob as
`ActorCritic`, on numpy views of the model's own parameters (so it reads whatever the model holds; rebuild it
after `toolbox.rl.weights.load_into`, which may re-point a parameter at new memory). The Gaussian noise and
categorical draws still come from the runner's ``torch.Generator``, so a runner's actions depend on its seed
exactly as before and its checkpointed generator state keeps its meaning; values agree with the torch forward
up to float32 rounding (`tests/unit/test_step_policy.py`). Policies with a CNN encoder, where the convolutions
dominate and torch is the faster, step through `TorchStepPolicy`, the torch forward behind the same interface.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import nn

from toolbox.models.mlp import HALF_LOG_2PI, ActorCritic

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # (actions, logp_B, value_B)


class StepPolicy(Protocol):
    """What an env runner needs from its policy each step, numpy in and out."""

    def prepare_obs(self, obs: np.ndarray) -> np.ndarray:
        """Raw observations ``[B, ...]`` -> the policy's float32 inputs ``[B, obs_dim]`` (normalised if configured)."""
        ...

    def act(self, x_BO: np.ndarray, generator: torch.Generator | None = None, deterministic: bool = False) -> Arrays:
        """``(actions, logp_B, value_B)`` as `ActorCritic.act` computes them."""
        ...

    def value(self, x_BO: np.ndarray) -> np.ndarray:
        """``value_B`` of prepared observations."""
        ...

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """Policy actions -> what the env accepts (ids offset by the space's start, or clipped to the Box)."""
        ...


def step_policy(model: ActorCritic) -> StepPolicy:
    """The numpy policy for an MLP encoder, the torch one otherwise (a CNN)."""
    return NumpyStepPolicy(model) if isinstance(model.encoder, nn.Identity) else TorchStepPolicy(model)


def _layers(net: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray, str | None]]:
    """``(weight_T, bias, activation after it)`` per linear layer, the weights as views of the parameters."""
    out: list[tuple[np.ndarray, np.ndarray, str | None]] = []
    for module in net:
        if isinstance(module, nn.Linear):
            out.append((module.weight.detach().numpy().T, module.bias.detach().numpy(), None))
        elif isinstance(module, (nn.Tanh, nn.ReLU)):
            weight_T, bias, _ = out[-1]
            out[-1] = (weight_T, bias, "tanh" if isinstance(module, nn.Tanh) else "relu")
        else:
            raise TypeError(f"NumpyStepPolicy cannot run a {type(module).__name__} layer")
    return out


def _forward(x_BI: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray, str | None]]) -> np.ndarray:
    for weight_T, bias, activation in layers:
        x_BI = x_BI @ weight_T
        x_BI += bias
        if activation == "tanh":
            np.tanh(x_BI, out=x_BI)
        elif activation == "relu":
            np.maximum(x_BI, 0.0, out=x_BI)
    return x_BI


class NumpyStepPolicy:
    """`ActorCritic`'s per-step path (``prepare_obs``, ``act``, ``value``, ``env_actions``) in numpy."""

    def __init__(self, model: ActorCritic) -> None:
        self.model, self.spec, self.cfg = model, model.spec, model.cfg
        self.actor, self.critic = _layers(model.actor), _layers(model.critic)
        self.log_std = None if model.discrete or model.state_dependent_std else model.log_std.detach().numpy()
        self.low = np.asarray(self.spec.low, np.float32)
        self.high = np.asarray(self.spec.high, np.float32)

    def prepare_obs(self, obs: np.ndarray) -> np.ndarray:
        x_BO = np.asarray(obs, dtype=np.float32).reshape(-1, self.spec.obs_dim)
        if not self.cfg.normalize_obs:
            return x_BO
        rms = self.model.obs_rms  # read every call: the statistics arrive with each weight sync
        mean = rms.mean.numpy().astype(np.float32)
        std = np.sqrt(rms.var.numpy().astype(np.float32) + np.float32(1e-8))  # as RunningMeanStd.normalize
        clip = self.cfg.obs_clip
        return np.clip((x_BO - mean) / std, -clip, clip)

    def value(self, x_BO: np.ndarray) -> np.ndarray:
        return _forward(x_BO, self.critic)[:, 0]

    def act(self, x_BO: np.ndarray, generator: torch.Generator | None = None, deterministic: bool = False) -> Arrays:
        out_BK = _forward(x_BO, self.actor)
        value_B = self.value(x_BO)
        if self.model.discrete:
            logp_BK = out_BK - out_BK.max(-1, keepdims=True)
            logp_BK -= np.log(np.exp(logp_BK).sum(-1, keepdims=True))
            if deterministic:
                actions = logp_BK.argmax(-1)
            else:
                probs = torch.from_numpy(np.exp(logp_BK))
                actions = torch.multinomial(probs, 1, generator=generator).squeeze(-1).numpy()
            return actions, logp_BK[np.arange(len(actions)), actions], value_B
        mean_BA, log_std = self._gaussian(out_BK)  # log_std: [A] (a parameter, broadcast) or [B, A]
        if deterministic:
            noise_BA = np.zeros_like(mean_BA)
        else:
            noise_BA = torch.randn(mean_BA.shape, generator=generator).numpy()
        actions = mean_BA + np.exp(log_std) * noise_BA
        logp_BA = -0.5 * noise_BA * noise_BA
        logp_BA -= log_std
        logp_BA -= np.float32(HALF_LOG_2PI)
        return actions, logp_BA.sum(-1), value_B

    def _gaussian(self, out_BK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.log_std is not None:
            return out_BK, self.log_std
        a = self.spec.action_dim
        low, high = self.cfg.log_std_bounds
        return out_BK[:, :a], np.clip(out_BK[:, a:], low, high)

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        if self.model.discrete:
            return actions.astype(np.int64) + self.spec.action_start
        return np.clip(actions.astype(np.float32), self.low, self.high)


class TorchStepPolicy:
    """`ActorCritic`'s own torch forward behind the `StepPolicy` interface (CNN encoders)."""

    def __init__(self, model: ActorCritic) -> None:
        self.model = model

    def prepare_obs(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model.prepare_obs(obs).numpy()

    def value(self, x_BO: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.model.value(torch.from_numpy(x_BO)).numpy()

    def act(self, x_BO: np.ndarray, generator: torch.Generator | None = None, deterministic: bool = False) -> Arrays:
        with torch.inference_mode():
            actions, logp, value = self.model.act(torch.from_numpy(x_BO), deterministic, generator)
        return actions.numpy(), logp.numpy(), value.numpy()

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        return self.model.env_actions(torch.from_numpy(actions))

