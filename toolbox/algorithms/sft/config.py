"""The SFT algorithm's config: the supervised objective, packing, label smoothing, the MoE router loss, and the
offline data it reads (prompt/response or messages records, or raw ``{"text": ...}`` documents for pretraining)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from toolbox.config.algorithm import AlgorithmConfig
from toolbox.data.offline import OfflineDataConfig
from toolbox.objectives.families import check_objective

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class SFTConfig(AlgorithmConfig, OfflineDataConfig):
    """The algorithm section of an SFT experiment (``batch_size`` counts examples)."""

    name: Literal["sft"] = Field("sft", description="Algorithm: selects the config, learner, loop and wiring.")
    objective: str = Field("sft", description="Supervised objective: 'sft' (mean over every target token of the "
                           "global batch) or 'seq' (mean over examples of each example's token mean).")
    packing: bool = Field(True, description="Pack several examples per row of max_length tokens (document-bounded attention).")
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="Cross-entropy label smoothing e: the target puts "
                                   "e/V on every token of the vocabulary and 1 - e more on the label.")
    moe_aux_loss_coef: float = Field(0.0, ge=0, description="Mixture-of-experts models (transformers' Qwen2MoE, "
                                     "Mixtral, ...): add coef x the router load-balancing loss the model returns "
                                     "(aux_loss), reported as moe_aux_loss. 0: off.")

    @field_validator("objective")
    @classmethod
    def _supervised(cls, value: str) -> str:
        return check_objective(value, "supervised", "sft")

    def check_micro_batch(self, num_workers: int, micro_batch_size: int) -> None:
        """Packed rows are data-dependent in number, so only unpacked batches must split into whole micro-batches."""
        self.check_batch(num_workers, micro_batch_size, "examples", strict_micro=not self.packing)

    def check(self, exp: ExperimentConfig) -> None:
        self.check_micro_batch(exp.learner.num_workers, exp.learner.micro_batch_size)
