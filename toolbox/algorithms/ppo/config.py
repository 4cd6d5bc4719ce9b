"""The language-model PPO section: a critic, token-level GAE, policy and value losses (clipped by default), KL in
reward or loss."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from toolbox.algorithms.grpo.config import POLICY_ROLES
from toolbox.algorithms.pieces import (
    KL,
    GroupSampling,
    OffPolicy,
    PolicyEpochs,
    PolicyLossChoice,
    RouterLossWeight,
    ValueLossChoice,
    check_off_policy,
    check_rollout_batch,
    rollout_batch,
)
from toolbox.config.algorithm import AlgorithmConfig, BatchShape, TrainedModels

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class PPOConfig(AlgorithmConfig, GroupSampling, PolicyEpochs, PolicyLossChoice, ValueLossChoice, KL, OffPolicy,
                RouterLossWeight):
    """The algorithm section of a language-model PPO experiment (``group_size`` may be 1)."""

    name: Literal["ppo"] = Field("ppo", description="Algorithm: selects the config, learner, loop and wiring.")
    group_size: int = Field(1, ge=1, description="Completions per prompt (PPO needs no groups).")
    ppo_epochs: int = Field(2, ge=1, description="Passes over each rollout batch.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount over response tokens.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda over response tokens.")
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    kl_in_reward: bool = Field(True, description="Subtract kl_coef * KL per token from the reward (else: a loss term).")
    critic_lr: float = Field(1e-3, gt=0, description="Learning rate of the critic.")
    whiten_advantages: bool = Field(True, description="Normalise advantages over the batch's response tokens.")
    roles: ClassVar[tuple[str, ...]] = POLICY_ROLES

    def check(self, exp: ExperimentConfig) -> None:
        check_rollout_batch(exp, self, self.mini_batches)
        check_off_policy(exp, self)

    def models(self) -> TrainedModels:
        return TrainedModels(reference=self.kl_coef > 0, critic=True)

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        return rollout_batch(exp, self, self.ppo_epochs, self.mini_batches)
