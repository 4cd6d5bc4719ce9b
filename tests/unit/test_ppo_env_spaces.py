"""Dict / Tuple / Discrete observations (flattened by gymnasium's FlattenObservation) and image observations
(the CNN encoder): the specs, the config checks, and a policy that learns a cue through each (in-process, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.unit.fake_envs import CUE, DICT_OBS, register_fake_envs
from toolbox.algorithms.ppo_env.config import PPOEnvConfig
from toolbox.algorithms.ppo_env.learner import PPOEnvLearner
from toolbox.config import load_config
from toolbox.core.errors import ConfigError
from toolbox.envs.config import EnvConfig
from toolbox.envs.env_runner import EnvRunner
from toolbox.envs.make import check_env
from toolbox.learner.config import LearnerConfig, OptimConfig
from toolbox.models.cnn import CNNConfig
from toolbox.models.mlp import ActorCritic, PolicyConfig

TINY_CNN = CNNConfig(channels=[8, 8], kernels=[3, 2], strides=[1, 1], features=32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny networks: a second thread only contends


def test_dict_tuple_and_discrete_observations_are_flattened_one_hot() -> None:
    register_fake_envs()
    assert check_env(EnvConfig(id=CUE["dict"])).obs_dim == 2 + 2  # one-hot Discrete(2) + Box(2)
    assert check_env(EnvConfig(id=CUE["tuple"])).obs_dim == 1 + 2
    assert check_env(EnvConfig(id=DICT_OBS)).obs_dim == 1
    assert check_env(EnvConfig(id="FrozenLake-v1")).obs_dim == 16  # Discrete(16) observations
    assert check_env(EnvConfig(id="Blackjack-v1")).obs_dim == 32 + 11 + 2  # Tuple of three Discretes
    image = check_env(EnvConfig(id=CUE["image"]))
    assert image.obs_shape == (6, 6, 1) and image.obs_dim == 36 and image.pixel_scale == pytest.approx(1 / 255)


def test_cnn_encoder_is_refused_for_vectors_and_for_images_too_small() -> None:
    register_fake_envs()
    with pytest.raises(ConfigError, match=r"algorithm.policy.encoder=cnn: env.id=CartPole-v1: .*got shape \(4,\)"):
        load_config(["experiment=ppo_cartpole", "algorithm.policy.encoder=cnn"])
    with pytest.raises(ConfigError, match=r"algorithm.policy.cnn: .*6x6 images: conv layer 0 \(kernel 8\)"):
        load_config(["experiment=ppo_cartpole", f"env.id={CUE['image']}", "algorithm.policy.encoder=cnn"])
    with pytest.raises(ConfigError, match="one entry per conv layer"):
        load_config(["experiment=ppo_cartpole", "algorithm.policy.cnn.kernels=[3]"])


def test_cnn_reads_the_image_layout_and_shares_its_features() -> None:
    register_fake_envs()
    spec = check_env(EnvConfig(id=CUE["image"]))
    model = ActorCritic(spec, PolicyConfig(hidden_sizes=[8], encoder="cnn", cnn=TINY_CNN))
    left, right = np.zeros((1, 6, 6, 1), np.uint8), np.zeros((1, 6, 6, 1), np.uint8)
    left[..., :3, :] = 255
    right[..., 3:, :] = 255
    feats = [model.encoder(model.prepare_obs(x)) for x in (left, right)]
    assert feats[0].shape == (1, 32) and not torch.equal(feats[0], feats[1])  # H, W, C kept apart, not scrambled
    names = {n.split(".")[0] for n, _ in model.named_parameters()}
    assert names == {"encoder", "actor", "critic"}  # one encoder, read by both heads
    logp, entropy, value = model(model.prepare_obs(np.concatenate([left, right])), torch.tensor([0, 1]))
    assert logp.shape == entropy.shape == value.shape == (2,)


@pytest.mark.parametrize("kind", sorted(CUE))
def test_policy_learns_the_cue_through_the_observation_space(kind: str) -> None:
    register_fake_envs()
    env = EnvConfig(id=CUE[kind], num_envs=4)
    spec = check_env(env)
    policy = PolicyConfig(hidden_sizes=[16], **({"encoder": "cnn", "cnn": TINY_CNN} if kind == "image" else {}))
    algo = PPOEnvConfig(policy=policy, gamma=0.5, epochs=4, minibatches=2, ent_coef=0.0)
    torch.manual_seed(0)
    learner = PPOEnvLearner(spec, algo, LearnerConfig(num_workers=1, strategy="single", optim=OptimConfig(lr=1e-2)), 10)
    runner = EnvRunner(env, policy, spec, algo.gamma, seed=0)
    paid = []  # mean reward per step of each rollout: 0.5 for a guess, 1 for reading the cue
    for _ in range(10):
        runner.load_weights(learner.policy.export_weights())
        batch, _ = runner.rollout(16)
        paid.append(float(batch.rewards_TN.mean()))
        learner.update([batch])
    assert paid[0] < 0.7, paid  # a fresh policy guesses
    assert np.mean(paid[-3:]) > 0.9, paid  # ... a trained one reads the cue (measured: 0.97-1.0 from rollout 5 on)
