"""PPO for language models with a critic: config, learner (policy + value model); the online policy loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import policy_wiring
from toolbox.algorithms.ppo.config import PPOConfig
from toolbox.config.algorithm import register_algorithm
from toolbox.core.events import EventBus
from toolbox.trainers.base import BaseTrainer

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("ppo", PPOConfig)
def wire(builder: ExperimentBuilder, bus: EventBus) -> BaseTrainer:
    """The online policy loop with a learner that also trains a value model."""
    from toolbox.algorithms.ppo.learner import PPOLearner

    return policy_wiring(builder, bus, PPOLearner, builder.algorithm(PPOConfig))
