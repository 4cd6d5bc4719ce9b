"""GRPO and its variants (RLOO, Dr. GRPO, ...) on stored rollouts: config, learner, and the offline loop (no rollout
or reward workers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolbox.algorithms.base import offline_plan
from toolbox.algorithms.offline_grpo.config import OfflineGRPOConfig
from toolbox.algorithms.plan import AlgorithmPlan
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder


@register_algorithm("offline_grpo", OfflineGRPOConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """GRPO on stored rollouts (samples.jsonl, or groups with rewards and behaviour log-probs), importance-corrected.

    No rollout or reward workers; the summary tracks the loss and how far the policy moved from the one that sampled
    the rollouts (behaviour_kl)."""
    from toolbox.algorithms.offline_grpo.learner import OfflineGRPOLearner

    return offline_plan(builder, OfflineGRPOLearner, ("loss", "behaviour_kl"))
