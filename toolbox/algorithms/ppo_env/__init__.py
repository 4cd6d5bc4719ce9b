"""PPO on gymnasium envs: config, learner (actor-critic MLP), its own loop (env runners instead of rollout +
reward workers), and the wiring."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from toolbox.algorithms.plan import AlgorithmPlan, LearnerPlan, RolePlan, Workers
from toolbox.algorithms.ppo_env.config import PPOEnvConfig
from toolbox.config.algorithm import register_algorithm

if TYPE_CHECKING:
    from toolbox.driver.experiment import ExperimentBuilder
    from toolbox.envs.env_runner import EnvRunner


def runner_seed(seed: int, rank: int) -> int:
    """Runner ``rank``'s seed: its env copies reset with ``runner_seed + i``, its actions sample from it."""
    return seed * 10**5 + rank * 10**3


def build_runner(c: Any, spec: Any, rank: int) -> EnvRunner:
    """Runner ``rank`` of the ``env`` role, built inside its actor."""
    from toolbox.envs.env_runner import EnvRunner

    return EnvRunner(c.env, c.algorithm.policy, spec, c.algorithm.gamma, runner_seed(c.trainer.seed, rank))


@register_algorithm("ppo_env", PPOEnvConfig)
def wire(builder: ExperimentBuilder) -> AlgorithmPlan:
    """Env runners -> learner for PPO on a gymnasium env (no reward workers: envs reward)."""
    from toolbox.actors.env_runner import EnvRunnerWorker
    from toolbox.actors.roles import EnvLearnerGroup, EnvRunnerGroup
    from toolbox.algorithms.ppo_env.learner import PPOEnvLearner
    from toolbox.algorithms.ppo_env.loop import PPOEnvTrainer
    from toolbox.envs.make import check_env

    c, algo = builder.cfg, builder.algorithm(PPOEnvConfig)
    spec = check_env(c.env)  # spaces checked (and made plain numbers) before any actor starts
    runners = Workers(EnvRunnerWorker, c.env.num_workers, lambda r: dict(rank=r, build=partial(build_runner, c, spec)),
                      c.env.timeout_s, c.env.cpus_per_worker)
    steps_per_step = c.env.num_workers * c.env.num_envs * algo.steps_per_env
    return AlgorithmPlan(
        LearnerPlan(partial(PPOEnvLearner, spec, algo, c.learner, c.trainer.total_steps), EnvLearnerGroup),
        lambda groups, bus: PPOEnvTrainer(builder.trainer_config(), bus, algo, groups["env"], groups["learner"],
                                          builder.run_dir, steps_per_step, c.experiment),
        (RolePlan("env", EnvRunnerGroup, runners),),
    )
