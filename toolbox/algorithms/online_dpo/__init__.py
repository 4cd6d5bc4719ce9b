"""Online DPO: config, learner (best vs worst sample of each group); the online policy loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import online_plan
from toolbox.algorithms.online_dpo.config import OnlineDPOConfig
from toolbox.algorithms.plan import AlgorithmPlan
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("online_dpo", OnlineDPOConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """The online policy loop with a learner that pairs each group's best and worst sample."""
    from toolbox.algorithms.online_dpo.learner import OnlineDPOLearner

    return online_plan(builder, OnlineDPOLearner, builder.algorithm(OnlineDPOConfig))
