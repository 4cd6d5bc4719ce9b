"""The two sides `toolbox.bench.env_throughput` measures: our env runners (and PPO step) and RLlib's.

Each side is built once per configuration (env, runners, envs per runner, vectorization) and then
measured in rounds, alternating with the other side: ``sample()`` is one rollout of every runner
(sampling only: the policy acts, the env steps, the trajectory is stored), ``learn()`` one whole
training step (sampling, the PPO update, the weight sync). Both return ``(env steps, seconds)``.
Both sides train the same network (two 64-64 tanh MLPs, policy and value apart) with the same batch
(runners x envs x ``steps_per_env``), 4 epochs of 4 minibatches, and step the same gymnasium id.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Protocol

EPOCHS, MINIBATCHES = 4, 4


@dataclass(frozen=True)
class Point:
    """One configuration: which env, how many runners, copies per runner, how they step."""

    env: str
    runners: int
    envs: int
    vectorization: str = "sync"

    @property
    def label(self) -> str:
        return f"{self.env} {self.runners}x{self.envs} {self.vectorization}"


class Side(Protocol):
    name: str

    def sample(self) -> tuple[int, float]: ...

    def learn(self) -> tuple[int, float]: ...

    def pids(self) -> list[int]:
        """The side's worker processes (env runners, a learner actor), whose CPU time `cpu_seconds` adds up."""
        ...

    def close(self) -> None: ...


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the driver and of ``pids`` with their children (an async vector env's
    subprocesses): what a side consumed, whatever share of the cores the rest of the machine left it."""
    import psutil

    total = time.process_time()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:  # a subprocess that ended between the listing and the read
            continue
    return total


def actor_pids(group: Any) -> list[int]:
    """The process ids of a `WorkerGroup`'s actors (none in local mode, where they run in the driver)."""
    import ray

    actors = getattr(group, "actors", [])
    if not ray.is_initialized() or not actors:
        return []
    return [int(pid) for pid in ray.get([a.__ray_call__.remote(lambda _self: os.getpid()) for a in actors])]


class Ours:
    """Our ``ppo_env`` roles, built by `ExperimentBuilder` as a run builds them (placement group, actors)."""

    name = "toolbox"

    def __init__(self, point: Point, steps_per_env: int) -> None:
        from toolbox.algorithms.ppo_env.loop import PPOEnvTrainer
        from toolbox.config import load_config
        from toolbox.driver.experiment import ExperimentBuilder

        cfg = load_config([
            "experiment=ppo_cartpole", f"env.id={point.env}", f"env.num_workers={point.runners}",
            f"env.num_envs={point.envs}", f"env.vectorization={point.vectorization}", "env.cpus_per_worker=0.25",
            "env.timeout_s=900", "learner.timeout_s=900",  # start-up on a loaded machine can take minutes
            f"algorithm.steps_per_env={steps_per_env}", f"algorithm.epochs={EPOCHS}",
            f"algorithm.minibatches={MINIBATCHES}", "algorithm.target_return=null", "algorithm.policy.hidden_sizes=[64,64]",
            "trainer.eval_every=0", "trainer.save_every=0", "trainer.total_steps=1000000", "callbacks=[]",
            f"trainer.run_root={tempfile.mkdtemp(prefix='bench-env-throughput-')}",
        ])
        self.steps_per_env, self.step = steps_per_env, 0
        self.builder = ExperimentBuilder(cfg)
        trainer = self.builder.build_trainer()
        assert isinstance(trainer, PPOEnvTrainer)
        self.trainer = trainer
        self.step = trainer.prepare()

    def sample(self) -> tuple[int, float]:
        t0 = time.perf_counter()
        rollouts = self.trainer.runners.rollout(self.steps_per_env).result()
        return sum(r.steps for r in rollouts), time.perf_counter() - t0

    def learn(self) -> tuple[int, float]:
        t0 = time.perf_counter()
        before = self.trainer.env_steps
        self.trainer.train_step(self.step)
        self.step += 1
        return self.trainer.env_steps - before, time.perf_counter() - t0

    def pids(self) -> list[int]:
        return actor_pids(self.trainer.runners.group) + actor_pids(self.trainer.learner.group)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.builder.shutdown()


class RLlib:
    """RLlib 2.60's PPO on its new API stack: ``SingleAgentEnvRunner`` actors, the learner in the driver."""

    name = "rllib"

    def __init__(self, point: Point, steps_per_env: int) -> None:
        from ray.rllib.algorithms.ppo import PPOConfig
        from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

        batch = point.runners * point.envs * steps_per_env
        config = (
            PPOConfig().environment(point.env)
            .env_runners(num_env_runners=point.runners, num_envs_per_env_runner=point.envs,
                         rollout_fragment_length=steps_per_env, gym_env_vectorize_mode=point.vectorization)
            .learners(num_learners=0)
            .training(train_batch_size_per_learner=batch, minibatch_size=batch // MINIBATCHES, num_epochs=EPOCHS)
            .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[64, 64], fcnet_activation="tanh",
                                                       vf_share_layers=False))
        )
        self.per_runner = point.envs * steps_per_env
        self.algo = config.build_algo()
        self.lifetime = 0

    def sample(self) -> tuple[int, float]:
        per_runner = self.per_runner

        def sample_steps(runner: Any) -> int:
            return sum(len(episode) for episode in runner.sample(num_timesteps=per_runner))

        group = self.algo.env_runner_group
        assert group is not None, "RLlib built no env runners"
        t0 = time.perf_counter()
        counts = group.foreach_env_runner(sample_steps, local_env_runner=False)
        return sum(counts), time.perf_counter() - t0

    def learn(self) -> tuple[int, float]:
        t0 = time.perf_counter()
        result = self.algo.train()
        dt = time.perf_counter() - t0
        lifetime = int(result["env_runners"]["num_env_steps_sampled_lifetime"])
        steps, self.lifetime = lifetime - self.lifetime, lifetime
        return steps, dt

    def pids(self) -> list[int]:
        """Its env runners (the learner runs in the driver, which `cpu_seconds` always counts)."""
        group = self.algo.env_runner_group
        assert group is not None, "RLlib built no env runners"
        return [int(pid) for pid in group.foreach_env_runner(lambda _runner: os.getpid(), local_env_runner=False)]

    def close(self) -> None:
        self.algo.stop()


def build(name: str, point: Point, steps_per_env: int) -> Side:
    return Ours(point, steps_per_env) if name == "toolbox" else RLlib(point, steps_per_env)
