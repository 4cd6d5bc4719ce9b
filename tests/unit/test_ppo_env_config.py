"""The ppo_env config: selected by algorithm.name, GRPO still the default, env and spaces checked up front."""

from __future__ import annotations

import pytest

from tests.unit.fake_envs import DICT_OBS, register_fake_envs
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.ppo_env.config import PPOEnvConfig
from toolbox.rl.envs import EnvConfig, SpaceSpec, check_env


def config_error(*args: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(list(args))
    return str(info.value)


def test_experiments_select_the_ppo_env_config_and_grpo_stays_the_default() -> None:
    cart = load_config(["experiment=ppo_cartpole"])
    assert isinstance(cart.algorithm, PPOEnvConfig) and cart.env.id == "CartPole-v1"
    assert cart.algorithm.target_return == 475 and cart.algorithm.eval_episodes >= 20
    pend = load_config(["experiment=ppo_pendulum"])
    assert isinstance(pend.algorithm, PPOEnvConfig) and pend.env.id == "Pendulum-v1"
    assert isinstance(load_config([]).algorithm, GRPOConfig)


def test_any_gymnasium_id_and_kwargs() -> None:
    cfg = load_config(["experiment=ppo_cartpole", "env.id=Acrobot-v1", "env.kwargs.max_episode_steps=100"])
    assert cfg.env.kwargs == {"max_episode_steps": 100}
    assert check_env(EnvConfig(id="MountainCarContinuous-v0")) == SpaceSpec(2, "continuous", 1, low=(-1.0,), high=(1.0,))


def test_unknown_env_id_fails_before_start() -> None:
    msg = config_error("experiment=ppo_cartpole", "env.id=NoSuchEnv-v9")
    assert "env.id" in msg and "NoSuchEnv-v9" in msg


def test_unsupported_spaces_name_the_env_and_the_space() -> None:
    register_fake_envs()
    msg = config_error("experiment=ppo_cartpole", f"env.id={DICT_OBS}")
    assert DICT_OBS in msg and "observation space Dict" in msg and "Box" in msg
    msg = config_error("experiment=ppo_cartpole", "env.id=Blackjack-v1")  # Tuple observations
    assert "Blackjack-v1" in msg and "Tuple" in msg


def test_fsdp2_and_a_target_without_evaluation_are_refused() -> None:
    assert "'single' or 'ddp'" in config_error("experiment=ppo_cartpole", "learner.strategy=fsdp2", "learner.num_workers=2")
    assert "trainer.eval_every" in config_error("experiment=ppo_cartpole", "trainer.eval_every=0")
    cfg = load_config(["experiment=ppo_cartpole", "trainer.eval_every=0", "algorithm.target_metric=episode_return"])
    assert cfg.algorithm.target_metric == "episode_return"


def test_batch_arithmetic_over_learner_ranks() -> None:
    msg = config_error("experiment=ppo_cartpole", "learner.strategy=ddp", "learner.num_workers=3")
    assert "batch arithmetic" in msg and "1024" in msg
