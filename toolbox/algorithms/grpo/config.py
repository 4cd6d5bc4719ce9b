"""The GRPO section: group-relative advantages, clipped surrogate, KL to a reference, and DAPO's options.

One config covers GRPO and its variants by choice of advantage estimator and policy loss with its clip range and
aggregation (Dr. GRPO: ``advantage=group_mean, loss.agg=seq-mean-token-sum-norm``; DAPO: ``loss.clip_high >
loss.clip_low``, ``dynamic_sampling``, ``overlong_buffer`` / ``overlong_filter``; RLOO: ``advantage=rloo``;
REINFORCE++: ``advantage=reinforce_pp``; GSPO: ``loss.name=gspo``; CISPO: ``loss.name=cispo``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from toolbox.algorithms.pieces import (
    KL,
    DynamicSampling,
    GroupSampling,
    OffPolicy,
    Overlong,
    PolicyEpochs,
    PolicyLossChoice,
    RouterLossWeight,
    check_off_policy,
    check_rollout_batch,
    rollout_batch,
)
from toolbox.config.algorithm import AlgorithmConfig, BatchShape, TrainedModels
from toolbox.core.errors import ConfigError

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig

POLICY_ROLES = ("rollout", "reward", "learner")  # what the online policy wiring builds, in order


class GRPOUpdate(GroupSampling, PolicyEpochs, PolicyLossChoice, KL, Overlong, OffPolicy, RouterLossWeight):
    """What `GRPOLearner` reads: the groups, the advantage estimator, the policy loss and its corrections. GRPO
    samples them (`GRPOConfig`); ``offline_grpo`` reads them from stored rollouts."""

    advantage: str = Field("group_norm", description="Advantage estimator: group_norm, group_mean, rloo, reinforce_pp.")

    def check_advantage(self) -> None:
        from toolbox.rl.advantages import ADVANTAGES

        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"algorithm.advantage: {self.advantage!r} is not one of {ADVANTAGES.names()}")


class GRPOConfig(AlgorithmConfig, GRPOUpdate, DynamicSampling):
    """The algorithm section of a GRPO experiment (and its variants)."""

    name: Literal["grpo"] = Field("grpo", description="Algorithm: selects the config, learner, loop and wiring.")
    roles: ClassVar[tuple[str, ...]] = POLICY_ROLES

    def check(self, exp: ExperimentConfig) -> None:
        self.check_advantage()
        check_rollout_batch(exp, self, self.mini_batches)
        check_off_policy(exp, self)

    def models(self) -> TrainedModels:
        return TrainedModels(reference=self.kl_coef > 0)

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        return rollout_batch(exp, self, self.ppo_epochs, self.mini_batches)
