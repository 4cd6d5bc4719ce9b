"""PPO on CartPole on a real local Ray: 2 env-runner actors + 2 DDP learner ranks learn well past random; with
1 learner rank (the layout of `ppo_cartpole`, which tests/e2e/test_ppo_cartpole.py trains to 475 through the CLI)
two steps show the wiring: the env-step count and the runners acting with the learner's weights."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from toolbox.config import load_config
from toolbox.experiment import ExperimentBuilder

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


def train(tmp_path: Path, ranks: int, steps: int, eval_every: int) -> dict[str, float]:
    """``steps`` PPO steps of 2 env runners and ``ranks`` learner ranks (DDP when 2); checks what every such run
    must hold and returns its summary."""
    strategy = "ddp" if ranks > 1 else "single"
    cfg = load_config(["experiment=ppo_cartpole", f"trainer.run_root={tmp_path}", "callbacks=[]",
                       "env.num_workers=2", f"learner.num_workers={ranks}", f"learner.strategy={strategy}",
                       f"trainer.total_steps={steps}", f"trainer.eval_every={eval_every}", "algorithm.target_return=null"])
    builder = ExperimentBuilder(cfg)
    try:
        trainer = builder.build_trainer()
        assert len(trainer.runners) == 2 and len(trainer.learner) == ranks
        summary = trainer.fit()
        assert summary["env_steps"] == steps * 2 * 4 * 128
        assert np.isfinite([m["value_loss"] for m in trainer.history]).all()
        # The runners act with exactly the learner's weights and normalisation statistics.
        learner_sd = trainer.learner.group.call("full_state_dict")[0]
        for rank, runner_sd in enumerate(trainer.runners.group.call("state_dict")):
            for name, tensor in learner_sd.items():
                assert torch.equal(runner_sd[name], tensor), f"runner {rank}: {name} differs from the learner"
        return summary
    finally:
        builder.shutdown()


def test_two_runners_act_with_the_weights_of_one_learner_rank(ray_session: None, tmp_path: Path) -> None:
    train(tmp_path, ranks=1, steps=2, eval_every=0)


def test_two_runners_and_two_ddp_ranks_beat_a_random_policy(ray_session: None, tmp_path: Path) -> None:
    summary = train(tmp_path, ranks=2, steps=12, eval_every=6)
    random_return = random_policy_return()
    assert random_return < 40
    assert summary["eval_return"] > random_return + 100, (summary, random_return)
