"""The ppo_env config: selected by algorithm.name, GRPO still the default, env and spaces checked up front,
env runners sized by the env section (the rollout and reward sections refused)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gymnasium import spaces

from tests.unit.fake_envs import TEXT_OBS, register_fake_envs
from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.algorithms.ppo_env.config import PPOEnvConfig
from toolbox.config import load_config
from toolbox.config.loader import dump_config
from toolbox.core.errors import ConfigError
from toolbox.driver.placement import trial_bundles
from toolbox.envs.config import EnvConfig
from toolbox.envs.make import check_env, spec_of
from toolbox.models.mlp import SpaceSpec


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
    assert check_env(EnvConfig(id="MountainCarContinuous-v0")) == SpaceSpec(2, "continuous", 1, low=(-1.0,), high=(1.0,),
                                                                           obs_shape=(2,))


def test_unknown_env_id_fails_before_start() -> None:
    msg = config_error("experiment=ppo_cartpole", "env.id=NoSuchEnv-v9")
    assert "env.id" in msg and "NoSuchEnv-v9" in msg


def test_unsupported_spaces_name_the_env_and_the_space() -> None:
    register_fake_envs()
    msg = config_error("experiment=ppo_cartpole", f"env.id={TEXT_OBS}")  # Dict and Tuple are flattened; Text is not
    assert TEXT_OBS in msg and "observation space Text" in msg and "Box observation space, or one of Dict" in msg
    with pytest.raises(ConfigError, match=r"env.id=my-env: action space MultiDiscrete\(\[2 3\]\) is not supported"):
        spec_of(spaces.Box(-1, 1, (2,)), spaces.MultiDiscrete([2, 3]), "my-env")


def test_fsdp2_and_a_target_without_evaluation_are_refused() -> None:
    assert "'single' or 'ddp'" in config_error("experiment=ppo_cartpole", "learner.strategy=fsdp2", "learner.num_workers=2")
    assert "trainer.eval_every" in config_error("experiment=ppo_cartpole", "trainer.eval_every=0")
    cfg = load_config(["experiment=ppo_cartpole", "trainer.eval_every=0", "algorithm.target_metric=episode_return"])
    assert cfg.algorithm.target_metric == "episode_return"


def test_batch_arithmetic_over_learner_ranks() -> None:
    msg = config_error("experiment=ppo_cartpole", "learner.strategy=ddp", "learner.num_workers=3")
    assert "batch arithmetic" in msg and "env.num_workers x env.num_envs" in msg and "1024" in msg
    # 3 runners x 4 envs x 128 steps = 1536 splits over 3 ranks: the runner count comes from env.num_workers.
    cfg = load_config(["experiment=ppo_cartpole", "env.num_workers=3", "learner.strategy=ddp", "learner.num_workers=3"])
    assert cfg.env.num_workers == 3


def test_env_runners_are_the_env_role_and_sized_by_the_env_section() -> None:
    cfg = load_config(["experiment=ppo_cartpole", "env.num_workers=3", "env.cpus_per_worker=0.75", "env.timeout_s=30"])
    assert PPOEnvConfig.roles == ("env", "learner")
    assert (cfg.env.num_workers, cfg.env.cpus_per_worker, cfg.env.timeout_s) == (3, 0.75, 30.0)
    # Tune's placement bundles: the driver's, 3 runners at 0.75 CPU, then the learner rank (0.5 CPU in the YAML).
    assert trial_bundles(cfg, driver_cpus=0.01) == [{"CPU": 0.01}, *[{"CPU": 0.75}] * 3, {"CPU": 0.5}]


@pytest.mark.parametrize(("override", "field"), [
    ("rollout.num_workers=2", "rollout.num_workers=2"),
    ("rollout.cpus_per_worker=1.0", "rollout.cpus_per_worker=1.0"),
    ("rollout.sampling.temperature=0.5", "rollout.sampling.temperature=0.5"),
    ("rollout.engine.name=http", "rollout.engine.name='http'"),
])
def test_rollout_settings_are_refused_naming_the_env_fields(override: str, field: str) -> None:
    msg = config_error("experiment=ppo_cartpole", override)
    assert msg.startswith(field + ":"), msg
    assert "does not use the rollout section" in msg and "env.num_workers" in msg


def test_reward_settings_are_refused() -> None:
    msg = config_error("experiment=ppo_cartpole", "reward.num_workers=3")
    assert msg.startswith("reward.num_workers=3:") and "the env gives the rewards" in msg, msg


def test_the_resolved_config_of_a_run_loads_again(tmp_path: Path) -> None:
    # A run's config.yaml writes every section, the unused ones at their defaults: that is not "setting" them.
    cfg = load_config(["experiment=ppo_cartpole"])
    path = tmp_path / "config.yaml"
    dump_config(cfg, path)
    again = load_config([f"experiment={path}"])
    assert again.env == cfg.env and again.rollout == cfg.rollout and again.algorithm == cfg.algorithm
