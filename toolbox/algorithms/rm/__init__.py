"""Reward-model training: Bradley-Terry on preference pairs, a scalar head on the base model; the offline loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import offline_plan
from toolbox.algorithms.plan import AlgorithmPlan
from toolbox.algorithms.rm.config import RMConfig
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("rm", RMConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """A reward model from chosen/rejected pairs; the summary tracks loss, pair accuracy and score margin.
    The run exports ``RUN_DIR/hf``: an ``AutoModelForSequenceClassification`` directory (the ``reward_model``
    reward's ``path``)."""
    from toolbox.algorithms.rm.learner import RMLearner

    return offline_plan(builder, RMLearner, ("loss", "accuracy", "margin"))
