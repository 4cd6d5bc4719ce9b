"""The offline DPO algorithm's config: the preference loss, beta, and the pairs it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from toolbox.algorithms.pieces import PreferenceLossChoice, RouterLossWeight, offline_batch
from toolbox.config.algorithm import AlgorithmConfig, BatchShape, TrainedModels
from toolbox.data.offline import Kind, OfflineDataConfig

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class DPOConfig(AlgorithmConfig, OfflineDataConfig, PreferenceLossChoice, RouterLossWeight):
    """The algorithm section of an offline DPO experiment (``batch_size`` counts preference pairs)."""

    name: Literal["dpo"] = Field("dpo", description="Algorithm: selects the config, learner, loop and wiring.")
    beta: float = Field(0.1, gt=0, description="Strength of the implicit KL to the frozen reference.")
    record_kind: ClassVar[Kind] = "preference"

    def check_micro_batch(self, num_workers: int, micro_batch_size: int) -> None:
        self.check_batch(num_workers, micro_batch_size, "preference pairs")

    def check(self, exp: ExperimentConfig) -> None:
        self.check_micro_batch(exp.learner.num_workers, exp.learner.micro_batch_size)

    def models(self) -> TrainedModels:
        return TrainedModels(reference=True)

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        return offline_batch(self)
