"""GRPO and its variants (Dr. GRPO, DAPO, RLOO, REINFORCE++): config, learner, and the online policy loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import online_plan
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.plan import AlgorithmPlan
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("grpo", GRPOConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """Rollout -> reward -> learner for GRPO; DAPO's dynamic sampling tops the batch up with more rounds."""
    from toolbox.algorithms.grpo.learner import GRPOLearner

    algo = builder.algorithm(GRPOConfig)
    return online_plan(builder, GRPOLearner, algo, dynamic=algo)
