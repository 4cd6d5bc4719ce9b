"""The SFT algorithm's config: the supervised loss, packing, the MoE router loss, and the offline data it reads
(prompt/response or messages records, or raw ``{"text": ...}`` documents for pretraining)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from toolbox.algorithms.pieces import RouterLossWeight, SupervisedLossChoice, offline_batch
from toolbox.config.algorithm import AlgorithmConfig, BatchShape
from toolbox.data.offline import OfflineDataConfig

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class SFTConfig(AlgorithmConfig, OfflineDataConfig, SupervisedLossChoice, RouterLossWeight):
    """The algorithm section of an SFT experiment (``batch_size`` counts examples)."""

    name: Literal["sft"] = Field("sft", description="Algorithm: selects the config, learner, loop and wiring.")
    packing: bool = Field(True, description="Pack several examples per row of max_length tokens (document-bounded attention).")

    def check_micro_batch(self, num_workers: int, micro_batch_size: int) -> None:
        """Packed rows are data-dependent in number, so only unpacked batches must split into whole micro-batches."""
        self.check_batch(num_workers, micro_batch_size, "examples", strict_micro=not self.packing)

    def check(self, exp: ExperimentConfig) -> None:
        self.check_micro_batch(exp.learner.num_workers, exp.learner.micro_batch_size)

    def batch(self, exp: ExperimentConfig) -> BatchShape:
        return offline_batch(self)
