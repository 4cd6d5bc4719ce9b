"""Offline DPO (sigmoid, IPO, hinge): config, learner (policy + frozen reference); the offline loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import offline_plan
from toolbox.algorithms.dpo.config import DPOConfig
from toolbox.algorithms.plan import AlgorithmPlan
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("dpo", DPOConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """Offline DPO on preference pairs; the summary tracks loss, preference accuracy and reward margin."""
    from toolbox.algorithms.dpo.learner import DPOLearner

    return offline_plan(builder, DPOLearner, ("loss", "accuracy", "margin"))
