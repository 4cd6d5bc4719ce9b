"""The SFT recipe: an FSDP2 learner group of `SFTLearner` ranks driven by `SFTTrainer`."""

from __future__ import annotations

from typing import Any

from toolbox.core.events import EventBus
from toolbox.learner.sft import SFTLearner
from toolbox.recipes import RECIPES
from toolbox.recipes.offline import offline_recipe
from toolbox.trainers.sft import SFTTrainer


@RECIPES.register("sft")
def sft_recipe(builder: Any, bus: EventBus) -> SFTTrainer:
    """Supervised fine-tuning on a JSONL file or a built-in task's prompt/answer pairs."""
    return offline_recipe(builder, bus, SFTLearner, SFTTrainer)


sft_recipe.roles = ("learner",)  # type: ignore[attr-defined]
