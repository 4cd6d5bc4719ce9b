"""The `raft` algorithm section: the group-sampling piece plus RAFT's one knob, ``min_reward``."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field
from toolbox.algorithms.pieces import GroupSampling
from toolbox.config.algorithm import AlgorithmConfig
from toolbox.core.errors import ConfigError

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class RaftConfig(AlgorithmConfig, GroupSampling):
    """RAFT: sample ``group_size`` completions per prompt, fine-tune on the best one when it scores well enough.

    Composes `GroupSampling` (``prompts_per_step``, ``group_size``, ``temperature``) and nothing
    else, so ``algorithm.kl_coef=0.1`` or ``algorithm.ppo_epochs=2`` is an error naming the field.
    """

    name: Literal["raft"] = Field("raft", description="Algorithm: selects the config, learner, loop and wiring.")
    min_reward: float = Field(1.0, description="A group's best completion is trained on only if its reward is at "
                              "least this (1.0 with a verifiable reward: correct answers only).")
    # The worker roles the wiring builds, in that order (placement-group bundles follow it).
    roles: ClassVar[tuple[str, ...]] = ("rollout", "reward", "learner")

    def check(self, exp: ExperimentConfig) -> None:
        """Every learner rank trains on the best row of as many groups as the others (collectives line up)."""
        workers = exp.learner.num_workers
        if self.prompts_per_step % workers:
            raise ConfigError(f"batch arithmetic: raft trains on one row per group, so algorithm.prompts_per_step="
                              f"{self.prompts_per_step} must split over learner.num_workers={workers} ranks")
