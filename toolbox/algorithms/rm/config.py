"""The reward-model algorithm's config: the preference pairs it reads and an optional score-centering term."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from toolbox.algorithms.pieces import RouterLossWeight, offline_batch
from toolbox.config.algorithm import AlgorithmConfig, BatchShape, TrainedModels
from toolbox.core.errors import ConfigError
from toolbox.data.offline import Kind, OfflineDataConfig
from toolbox.models.reward_head import load_reward_model

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class RMConfig(AlgorithmConfig, OfflineDataConfig, RouterLossWeight):
    """The algorithm section of a reward-model run (``batch_size`` counts preference pairs)."""

    name: Literal["rm"] = Field("rm", description="Algorithm: selects the config, learner, loop and wiring.")
    center_rewards_coef: float = Field(0.0, ge=0, description="Adds coef * mean((s_chosen + s_rejected)^2) to the "
                                       "loss, keeping scores near 0 (Eisenstein et al. 2023); 0: plain Bradley-Terry.")
    record_kind: ClassVar[Kind] = "preference"

    def check_micro_batch(self, num_workers: int, micro_batch_size: int) -> None:
        self.check_batch(num_workers, micro_batch_size, "preference pairs")

    def check(self, exp: ExperimentConfig) -> None:
        self.check_micro_batch(exp.learner.num_workers, exp.learner.micro_batch_size)
        if exp.learner.lora is not None:
            raise ConfigError("learner.lora: algorithm 'rm' trains the whole model with its new score head; LoRA "
                              "adapters are for causal-LM policies (unset learner.lora)")

    def models(self) -> TrainedModels:
        # The base model with a scalar head, what the learner trains and `toolbox.commands.export` writes; no reference
        return TrainedModels(policy="sequence_classifier", load=load_reward_model)

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        return offline_batch(self)
