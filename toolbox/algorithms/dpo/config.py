"""The offline DPO algorithm's config: preference loss, beta, label smoothing, and the pairs it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from toolbox.config.algorithm import AlgorithmConfig
from toolbox.data.offline import Kind, OfflineDataConfig
from toolbox.objectives.families import check_objective

if TYPE_CHECKING:
    from toolbox.config.schema import ExperimentConfig


class DPOConfig(AlgorithmConfig, OfflineDataConfig):
    """The algorithm section of an offline DPO experiment (``batch_size`` counts preference pairs)."""

    name: Literal["dpo"] = Field("dpo", description="Algorithm: selects the config, learner, loop and wiring.")
    loss_type: str = Field("sigmoid", description="Preference loss: 'sigmoid' (DPO), 'ipo' or 'hinge' (SLiC).")
    beta: float = Field(0.1, gt=0, description="Strength of the implicit KL to the frozen reference.")
    label_smoothing: float = Field(0.0, ge=0, le=0.5, description="Conservative DPO: probability a label is flipped (sigmoid only).")
    record_kind: ClassVar[Kind] = "preference"

    @field_validator("loss_type")
    @classmethod
    def _preference(cls, value: str) -> str:
        return check_objective(value, "preference", "dpo")

    @model_validator(mode="after")
    def _smoothing(self) -> DPOConfig:
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise ValueError(f"label_smoothing={self.label_smoothing} applies to loss_type 'sigmoid' only, "
                             f"not {self.loss_type!r}")
        return self

    @property
    def average_logps(self) -> bool:
        """IPO uses length-averaged sequence log-probs (as its authors and TRL do); the others use sums."""
        return self.loss_type == "ipo"

    def check_micro_batch(self, num_workers: int, micro_batch_size: int) -> None:
        self.check_batch(num_workers, micro_batch_size, "preference pairs")

    def check(self, exp: ExperimentConfig) -> None:
        self.check_micro_batch(exp.learner.num_workers, exp.learner.micro_batch_size)
