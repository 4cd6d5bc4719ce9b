"""Supervised fine-tuning: config (data, packing, objective), learner; the offline loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import offline_plan
from toolbox.algorithms.plan import AlgorithmPlan
from toolbox.algorithms.sft.config import SFTConfig
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("sft", SFTConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """SFT on a JSONL file or a built-in task's prompt/answer pairs; the summary tracks the loss."""
    from toolbox.algorithms.sft.learner import SFTLearner

    return offline_plan(builder, SFTLearner, ("loss",))
