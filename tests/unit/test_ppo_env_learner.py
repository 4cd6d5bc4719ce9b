"""The PPO env learner: GAE over terminations and truncations (hand-computed), losses, update, weights, checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolbox.algorithms.ppo_env.config import PPOEnvConfig
from toolbox.algorithms.ppo_env.learner import PPOEnvLearner, returns_and_advantages
from toolbox.envs.config import EnvConfig
from toolbox.envs.env_runner import EnvRunner
from toolbox.envs.make import check_env
from toolbox.envs.trajectory import TrajectoryBatch
from toolbox.learner.config import LearnerConfig, OptimConfig
from toolbox.models.mlp import PolicyConfig
from toolbox.objectives.ppo import value_loss


def one_env_batch(terminated: list[bool], truncated: list[bool], final_values: list[float]) -> TrajectoryBatch:
    """T=3, N=1: rewards 1, values 0.5 0.6 0.7, V(after last step) = 2."""
    col = lambda xs, dtype=torch.float32: torch.tensor(xs, dtype=dtype).reshape(3, 1)  # noqa: E731
    return TrajectoryBatch(
        obs_TNO=torch.zeros(3, 1, 1), actions_TN=torch.zeros(3, 1, dtype=torch.int64), logp_TN=col([0.0] * 3),
        values_TN=col([0.5, 0.6, 0.7]), rewards_TN=col([1.0] * 3), terminated_TN=col(terminated, torch.bool),
        truncated_TN=col(truncated, torch.bool), final_values_TN=col(final_values), last_value_N=torch.tensor([2.0]),
        discounted_returns_TN=col([0.0] * 3), obs_mean_O=torch.zeros(1), obs_var_O=torch.ones(1), obs_count=0.0,
    )


GAMMA, LAM = 0.9, 0.8


def advantages(batch: TrajectoryBatch) -> list[float]:
    adv, ret = returns_and_advantages(batch, batch.rewards_TN, GAMMA, LAM)
    assert torch.allclose(ret, adv + batch.values_TN)
    return [round(x, 6) for x in adv[:, 0].tolist()]


def test_gae_termination_cuts_the_bootstrap() -> None:
    # t=2: 1 + .9*2 - .7 = 2.1 | t=1 (terminal): 1 - .6 = .4 | t=0: 1 + .9*.6 - .5 + .9*.8*.4 = 1.328
    assert advantages(one_env_batch([False, True, False], [False] * 3, [0.0, 0.0, 0.0])) == [1.328, 0.4, 2.1]


def test_gae_truncation_bootstraps_from_the_final_observation() -> None:
    # t=1 (truncated, V(final) = 3): 1 + .9*3 - .6 = 3.1 | t=0: 1.04 + .72*3.1 = 3.272 | t=2 unchanged
    assert advantages(one_env_batch([False] * 3, [False, True, False], [0.0, 3.0, 0.0])) == [3.272, 3.1, 2.1]


def test_gae_terminated_and_truncated_at_once_is_a_termination() -> None:
    assert advantages(one_env_batch([False, True, False], [False, True, False], [0.0, 3.0, 0.0])) == [1.328, 0.4, 2.1]


def test_gae_no_episode_end_bootstraps_from_the_last_value() -> None:
    # t=2: 2.1 | t=1: 1 + .9*.7 - .6 = 1.03 + .72*2.1 = 2.542 | t=0: 1.04 + .72*2.542 = 2.87024
    assert advantages(one_env_batch([False] * 3, [False] * 3, [0.0] * 3)) == [2.87024, 2.542, 2.1]


def test_clipped_value_loss() -> None:
    old, ret = torch.tensor([1.0, 1.0]), torch.tensor([2.0, 0.0])
    new = torch.tensor([1.5, 1.5])  # moved 0.5; clip 0.2 keeps 1.2 in the clipped branch
    # sample 0: max((1.5-2)^2, (1.2-2)^2) = .64 | sample 1: max(1.5^2, 1.2^2) = 2.25 -> 0.5 * mean = 0.7225
    assert float(value_loss(new, old, ret, 0.2)) == pytest.approx(0.7225)
    assert float(value_loss(new, old, ret, 0.0)) == pytest.approx(0.5 * (0.25 + 2.25) / 2)


def make(normalize: bool = True, optim: OptimConfig | None = None, total_steps: int = 10,
         **algo: object) -> tuple[PPOEnvLearner, EnvRunner]:
    env = EnvConfig(id="CartPole-v1", num_envs=2)
    cfg = PPOEnvConfig(policy=PolicyConfig(hidden_sizes=[16], normalize_obs=normalize), **algo)
    spec = check_env(env)
    torch.manual_seed(0)
    cfg_l = LearnerConfig(num_workers=1, strategy="single", optim=optim or OptimConfig(lr=1e-3))
    learner = PPOEnvLearner(spec, cfg, cfg_l, total_steps)
    return learner, EnvRunner(env, cfg.policy, spec, cfg.gamma, seed=0)


def test_linear_schedule_decays_over_every_optimizer_step_of_the_run() -> None:
    # 1 training step x 2 epochs x 2 minibatches = 4 optimizer steps at lr x (1, .75, .5, .25).
    learner, runner = make(optim=OptimConfig(lr=1e-3, scheduler="linear"), total_steps=1, epochs=2, minibatches=2)
    runner.load_weights(learner.policy.export_weights())
    metrics = learner.update([runner.rollout(16)[0]])
    assert metrics["updates"] == 4
    assert metrics["lr"] == pytest.approx(1e-3 * (1 + 0.75 + 0.5 + 0.25) / 4)
    assert learner.policy.trained.scheduler.get_last_lr()[0] == pytest.approx(0.0)


def test_update_trains_folds_stats_and_exports_to_the_runner() -> None:
    learner, runner = make(scale_rewards=True, epochs=2, minibatches=4)
    runner.load_weights(learner.policy.export_weights())
    before = {k: v.clone() for k, v in learner.policy.full_state_dict().items()}
    batch, _ = runner.rollout(32)
    metrics = learner.update([batch])
    assert metrics["updates"] == 8 and all(v == v for v in metrics.values())  # 2 epochs x 4 minibatches, no NaN
    after = learner.policy.full_state_dict()
    assert not torch.equal(before["actor.0.weight"], after["actor.0.weight"])
    assert float(after["obs_rms.count"]) == pytest.approx(64, abs=1e-3)  # 32 steps x 2 envs of raw observations
    assert float(after["ret_rms.count"]) == pytest.approx(64, abs=1e-3)
    runner.load_weights(learner.policy.export_weights())
    for name, tensor in runner.model.state_dict().items():
        assert torch.equal(tensor, after[name]), name


def test_target_kl_stops_the_epochs_early() -> None:
    learner, runner = make(target_kl=1e-9, epochs=4, minibatches=2)
    runner.load_weights(learner.policy.export_weights())
    metrics = learner.update([runner.rollout(16)[0]])
    assert metrics["kl_stopped"] == 1.0 and metrics["updates"] < 8


def test_checkpoint_restores_weights_statistics_and_step(tmp_path: Path) -> None:
    learner, runner = make()
    runner.load_weights(learner.policy.export_weights())
    learner.update([runner.rollout(16)[0]])
    saved = {k: v.clone() for k, v in learner.policy.full_state_dict().items()}
    learner.policy.save(tmp_path / "ckpt")
    fresh, _ = make()
    assert fresh.policy.load(tmp_path / "ckpt") == 1
    for name, tensor in fresh.policy.full_state_dict().items():
        assert torch.equal(tensor, saved[name]), name
