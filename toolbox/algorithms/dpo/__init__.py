"""Offline DPO (sigmoid, IPO, hinge): config, learner (policy + frozen reference); the offline loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import offline_wiring
from toolbox.algorithms.dpo.config import DPOConfig
from toolbox.config.algorithm import register_algorithm
from toolbox.core.events import EventBus
from toolbox.trainers.base import BaseTrainer

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("dpo", DPOConfig)
def wire(builder: ExperimentBuilder, bus: EventBus) -> BaseTrainer:
    """Offline DPO on preference pairs; the summary tracks loss, preference accuracy and reward margin."""
    from toolbox.algorithms.dpo.learner import DPOLearner

    return offline_wiring(builder, bus, DPOLearner, ("loss", "accuracy", "margin"))
