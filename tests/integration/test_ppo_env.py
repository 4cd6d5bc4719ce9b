"""PPO on CartPole on a real local Ray: 2 env-runner actors + 1 learner rank (or 2 DDP ranks) learn well past random."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from toolbox.actors.env_runner import EnvRunnerWorker
from toolbox.actors.learner import LearnerWorker

from toolbox.config import load_config
from toolbox.driver.experiment import ExperimentBuilder

pytestmark = pytest.mark.integration


def random_policy_return(episodes: int = 20, seed: int = 0) -> float:
    env = gym.make("CartPole-v1")
    env.action_space.seed(seed)
    total = 0.0
    for i in range(episodes):
        env.reset(seed=seed + i)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
    return total / episodes


@pytest.mark.parametrize(("strategy", "ranks"), [("single", 1), ("ddp", 2)])
def test_two_runners_and_a_learner_beat_a_random_policy(ray_session: None, tmp_path: Path, strategy: str,
                                                        ranks: int) -> None:
    cfg = load_config(["experiment=ppo_cartpole", f"trainer.run_root={tmp_path}", "callbacks=[]",
                       "env.num_workers=2", f"learner.num_workers={ranks}", f"learner.strategy={strategy}",
                       "trainer.total_steps=12", "trainer.eval_every=6", "algorithm.target_return=null"])
    builder = ExperimentBuilder(cfg)
    try:
        trainer = builder.build_trainer()
        assert len(trainer.runners) == 2 and len(trainer.learner) == ranks
        summary = trainer.fit()
        random_return = random_policy_return()
        assert random_return < 40
        assert summary["eval_return"] > random_return + 100, (summary, random_return)
        assert summary["env_steps"] == 12 * 2 * 4 * 128
        assert np.isfinite([m["value_loss"] for m in trainer.history]).all()
        # The runners act with exactly the learner's weights and normalisation statistics.
        learner_sd = trainer.learner.group.each(LearnerWorker.full_state_dict).result()[0]
        for rank, runner_sd in enumerate(trainer.runners.group.each(EnvRunnerWorker.state_dict).result()):
            for name, tensor in learner_sd.items():
                assert torch.equal(runner_sd[name], tensor), f"runner {rank}: {name} differs from the learner"
    finally:
        builder.shutdown()
