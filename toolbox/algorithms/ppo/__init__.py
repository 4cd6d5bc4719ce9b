"""PPO for language models with a critic: config, learner (policy + value model); the online policy loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import online_plan
from toolbox.algorithms.plan import AlgorithmPlan
from toolbox.algorithms.ppo.config import PPOConfig
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("ppo", PPOConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """The online policy loop with a learner that also trains a value model."""
    from toolbox.algorithms.ppo.learner import PPOLearner

    return online_plan(builder, PPOLearner, builder.algorithm(PPOConfig))
