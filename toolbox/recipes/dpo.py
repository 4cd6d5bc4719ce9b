"""The offline DPO recipe: an FSDP2 learner group of `DPOLearner` ranks (policy + frozen reference)."""

from __future__ import annotations

from typing import Any

from toolbox.core.events import EventBus
from toolbox.learner.dpo import DPOLearner
from toolbox.recipes import RECIPES
from toolbox.recipes.offline import offline_recipe
from toolbox.trainers.dpo import DPOTrainer


@RECIPES.register("dpo")
def dpo_recipe(builder: Any, bus: EventBus) -> DPOTrainer:
    """Offline DPO on a JSONL file of preference pairs or pairs generated from a built-in task."""
    return offline_recipe(builder, bus, DPOLearner, DPOTrainer)


dpo_recipe.roles = ("learner",)  # type: ignore[attr-defined]
