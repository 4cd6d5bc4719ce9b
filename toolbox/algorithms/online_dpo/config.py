"""The online DPO section: preference pairs made on the fly from sampled groups (best vs worst by reward)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from toolbox.algorithms.grpo.config import POLICY_ROLES
from toolbox.algorithms.pieces import (
    GroupSampling,
    PreferenceLossChoice,
    RouterLossWeight,
    check_rollout_batch,
    rollout_batch,
)
from toolbox.config.algorithm import PAIR_ROWS, AlgorithmConfig, BatchShape, TrainedModels
from toolbox.core.errors import ConfigError

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class OnlineDPOConfig(AlgorithmConfig, GroupSampling, PreferenceLossChoice, RouterLossWeight):
    """The algorithm section of an online DPO experiment (``group_size`` >= 2 samples per prompt)."""

    name: Literal["online_dpo"] = Field("online_dpo", description="Algorithm: selects the config, learner, loop and wiring.")
    group_size: int = Field(4, ge=2, description="Samples per prompt; the best and worst by reward form a pair.")
    beta: float = Field(0.1, gt=0, description="Strength of the implicit KL to the frozen reference.")
    roles: ClassVar[tuple[str, ...]] = POLICY_ROLES

    def check(self, exp: ExperimentConfig) -> None:
        workers = exp.learner.num_workers
        check_rollout_batch(exp, self)
        if self.prompts_per_step % workers:
            raise ConfigError(f"batch arithmetic: online_dpo pairs within whole groups, so algorithm.prompts_per_step="
                              f"{self.prompts_per_step} must split over learner.num_workers={workers} ranks")

    def models(self) -> TrainedModels:
        return TrainedModels(reference=True)  # DPO measures the policy against the frozen initial one

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        """The rollouts sampled, then trained on as one (best, worst) pair per group."""
        sampled = rollout_batch(exp, self)
        pairs = ("preference pairs per step", f"one per group = {self.prompts_per_step}")
        return BatchShape(self.prompts_per_step, "pairs", rows_per_example=PAIR_ROWS, how=(*sampled.how, pairs))
