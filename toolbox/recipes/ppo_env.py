"""The classic-RL recipe: gymnasium env-runner actors and a PPO learner group (no reward workers: envs reward)."""

from __future__ import annotations

from functools import partial
from typing import Any

from toolbox.actors.env_runner import EnvRunnerWorker
from toolbox.core.events import EventBus
from toolbox.learner.ppo_env import PPOEnvLearner
from toolbox.recipes import RECIPES
from toolbox.rl.env_runner import EnvRunner
from toolbox.rl.envs import check_env
from toolbox.trainers.ppo_env import PPOEnvTrainer


def runner_seed(seed: int, rank: int) -> int:
    """Runner ``rank``'s seed: its env copies reset with ``runner_seed + i``, its actions sample from it."""
    return seed * 10**5 + rank * 10**3


def build_runner(c: Any, spec: Any, rank: int) -> EnvRunner:
    return EnvRunner(c.env, c.algorithm.policy, spec, c.algorithm.gamma, runner_seed(c.trainer.seed, rank))


@RECIPES.register("ppo_env")
def ppo_env_recipe(builder: Any, bus: EventBus) -> PPOEnvTrainer:
    """Wire env runners -> learner for PPO on a gymnasium env."""
    c = builder.cfg
    spec = check_env(c.env)  # spaces checked (and made plain numbers) before any actor starts
    runners = builder.group(
        "rollout", EnvRunnerWorker, c.rollout.num_workers, lambda r: dict(rank=r, build=partial(build_runner, c, spec)),
        c.rollout.timeout_s, c.rollout.cpus_per_worker, 0.0,
    )
    learner = builder.learner_group(partial(PPOEnvLearner, spec, c.algorithm, c.learner, c.trainer.total_steps))
    steps_per_step = c.rollout.num_workers * c.env.num_envs * c.algorithm.steps_per_env
    return PPOEnvTrainer(builder.trainer_config(), bus, c.algorithm, runners, learner, builder.run_dir, steps_per_step,
                         c.experiment)


# Env runners use the rollout section of the config.
ppo_env_recipe.roles = ("rollout", "learner")  # type: ignore[attr-defined]
