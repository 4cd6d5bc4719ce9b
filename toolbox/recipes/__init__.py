"""Recipes: how each algorithm's objects are wired together (worker groups, learner, trainer).

A recipe is a function ``(ExperimentBuilder, EventBus) -> BaseTrainer`` registered
under the algorithm's name. It sits at the experiment layer: it may use actors and
trainers; trainers and the library never import it.
"""

from toolbox.core.registry import Registry

RECIPES: Registry = Registry("recipe")

from toolbox.recipes import dpo, grpo, ppo_env, sft  # noqa: E402,F401  (registers built-in recipes)
