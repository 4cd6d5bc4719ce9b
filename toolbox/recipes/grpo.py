"""The GRPO recipe: hf/vLLM/SGLang rollout workers, reward workers, an FSDP2 learner group."""

from __future__ import annotations

from functools import partial
from typing import Any

from toolbox.actors.reward import RewardWorker
from toolbox.actors.rollout import RolloutWorker
from toolbox.core.events import EventBus
from toolbox.data.prompts import PromptSource
from toolbox.data.tasks import TASKS
from toolbox.engines import ENGINES
from toolbox.learner.learner import Learner
from toolbox.learner.online_dpo import OnlineDPOLearner
from toolbox.learner.ppo_lm import PPOLearner
from toolbox.models.loading import load_tokenizer
from toolbox.recipes import RECIPES
from toolbox.trainers.grpo import GRPOTrainer


def build_engine(spec: dict[str, Any], model_path: str, dtype: str, seed: int, rank: int) -> Any:
    return ENGINES.build(spec, inject={"model_path": model_path, "dtype": dtype, "seed": seed + 1000 * rank})


@RECIPES.register("grpo")
def grpo_recipe(builder: Any, bus: EventBus) -> GRPOTrainer:
    """Wire rollout -> reward -> learner for GRPO and its variants."""
    return policy_recipe(builder, bus, Learner)


@RECIPES.register("ppo")
def ppo_recipe(builder: Any, bus: EventBus) -> GRPOTrainer:
    """PPO with a critic: the GRPO loop with a learner that also trains a value model."""
    return policy_recipe(builder, bus, PPOLearner)


@RECIPES.register("online_dpo")
def online_dpo_recipe(builder: Any, bus: EventBus) -> GRPOTrainer:
    """Online DPO: the GRPO loop with a learner that pairs each group's best and worst sample."""
    return policy_recipe(builder, bus, OnlineDPOLearner)


POLICY_ROLES = ("rollout", "reward", "learner")  # the order policy_recipe builds them in
for _recipe in (grpo_recipe, ppo_recipe, online_dpo_recipe):
    _recipe.roles = POLICY_ROLES  # type: ignore[attr-defined]


def policy_recipe(builder: Any, bus: EventBus, learner_cls: type) -> GRPOTrainer:
    """Rollout workers, reward workers and a learner group of ``learner_cls`` around the GRPO loop."""
    c, path = builder.cfg, builder.model_path
    rollout = builder.group(
        "rollout", RolloutWorker, c.rollout.num_workers,
        lambda r: dict(rank=r, build=partial(build_engine, c.rollout.engine, path, c.model.dtype, c.trainer.seed)),
        c.rollout.timeout_s, c.rollout.cpus_per_worker, c.rollout.gpus_per_worker,
    )
    reward = builder.group(
        "reward", RewardWorker, c.reward.num_workers,
        lambda r: dict(rank=r, spec=c.reward.spec, run=c.reward.run, model_path=path),
        c.reward.timeout_s, c.reward.cpus_per_worker, 0.0,
    )
    learner = builder.learner_group(partial(learner_cls, path, c.model.dtype, c.learner, c.algorithm, c.trainer.total_steps))
    prompts = PromptSource(TASKS.build(c.task), load_tokenizer(path), c.trainer.seed)
    return GRPOTrainer(builder.trainer_config(), bus, c.algorithm, c.rollout.sampling, prompts, rollout, reward, learner,
                       builder.run_dir, c.experiment)
