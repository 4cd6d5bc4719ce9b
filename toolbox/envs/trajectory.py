"""`TrajectoryBatch`: what an env runner hands the learner, time-major ``[T, N]`` (steps x env copies)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from toolbox.core.wire import TensorFields


@dataclass
class TrajectoryBatch(TensorFields):
    """One rollout of ``T`` steps in each of ``N`` env copies.

    ``obs_TNO`` are the policy inputs exactly as the runner saw them (normalised with
    the statistics it held), so the learner's log-probs match the behaviour ones.
    Rewards are the env's raw rewards; any scaling is the learner's. An episode that
    ends at step t has ``terminated_TN[t]`` or ``truncated_TN[t]`` set, and for a
    truncation ``final_values_TN[t]`` is the value of its final observation (which
    the vector env replaced by the next episode's first one); it is 0 elsewhere.
    """

    obs_TNO: torch.Tensor
    actions_TN: torch.Tensor  # [T, N] int64 (discrete) or [T, N, A] float32 (raw Gaussian samples)
    logp_TN: torch.Tensor
    values_TN: torch.Tensor
    rewards_TN: torch.Tensor
    terminated_TN: torch.Tensor  # bool
    truncated_TN: torch.Tensor  # bool
    final_values_TN: torch.Tensor
    last_value_N: torch.Tensor  # value of the observation after the last step
    discounted_returns_TN: torch.Tensor  # running discounted return per env, for reward scaling
    obs_mean_O: torch.Tensor  # moments of the raw observations of this rollout (float64)
    obs_var_O: torch.Tensor
    obs_count: float

    @property
    def num_steps(self) -> int:
        return int(self.rewards_TN.shape[0] * self.rewards_TN.shape[1])

    @staticmethod
    def concat_envs(batches: list[TrajectoryBatch]) -> TrajectoryBatch:
        """Side by side along the env dimension (all batches must have the same T).

        The observation moments are not merged here: the learner folds each batch's
        moments into its running statistics one by one.
        """
        if len({b.rewards_TN.shape[0] for b in batches}) != 1:
            raise ValueError(f"rollouts of different lengths cannot be joined: {[b.rewards_TN.shape[0] for b in batches]}")
        out = {}
        for f in fields(TrajectoryBatch):
            if f.name.startswith("obs_") and f.name != "obs_TNO":
                continue
            dim = 0 if f.name == "last_value_N" else 1
            out[f.name] = torch.cat([getattr(b, f.name) for b in batches], dim=dim)
        first = batches[0]
        return TrajectoryBatch(**out, obs_mean_O=first.obs_mean_O, obs_var_O=first.obs_var_O, obs_count=0.0)
