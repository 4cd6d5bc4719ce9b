"""`ActorCritic`: categorical and Gaussian heads (log-prob, entropy, modes, clipping), observation normalisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from toolbox.models.mlp import ActorCritic, PolicyConfig, SpaceSpec

DISCRETE = SpaceSpec(obs_dim=4, action_kind="discrete", action_dim=3, action_start=1)
GAUSSIAN = SpaceSpec(obs_dim=3, action_kind="continuous", action_dim=2, low=(-1.0, -2.0), high=(1.0, 2.0))


def test_discrete_logp_and_entropy_match_the_softmax() -> None:
    torch.manual_seed(0)
    model = ActorCritic(DISCRETE, PolicyConfig())
    obs = torch.randn(5, 4)
    actions = torch.tensor([0, 1, 2, 1, 0])
    logp, entropy, value = model(obs, actions)
    log_probs = torch.log_softmax(model.actor(obs), dim=-1)
    assert torch.allclose(logp, log_probs.gather(1, actions[:, None]).squeeze(1))
    assert torch.allclose(entropy, -(log_probs.exp() * log_probs).sum(-1))
    assert value.shape == (5,)


def test_discrete_mode_is_argmax_and_env_ids_are_offset_by_start() -> None:
    model = ActorCritic(DISCRETE, PolicyConfig())
    obs = torch.randn(6, 4)
    actions, _, _ = model.act(obs, deterministic=True)
    assert torch.equal(actions, model.actor(obs).argmax(-1))
    assert (model.env_actions(actions) == actions.numpy() + 1).all()


def test_gaussian_logp_entropy_with_state_independent_std() -> None:
    model = ActorCritic(GAUSSIAN, PolicyConfig(init_log_std=-0.5))
    obs = torch.randn(4, 3)
    actions = torch.randn(4, 2)
    logp, entropy, _ = model(obs, actions)
    mean, std = model.actor(obs), math.exp(-0.5)
    expected = (-((actions - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
    assert torch.allclose(logp, expected, atol=1e-5)
    per_dim = 0.5 + 0.5 * math.log(2 * math.pi) + math.log(std)
    assert torch.allclose(entropy, torch.full((4,), 2 * per_dim))
    # The std does not depend on the state: same for every observation.
    dist = model.distribution(obs)
    assert torch.allclose(dist.stddev, torch.full((4, 2), std))
    assert [n for n, _ in model.named_parameters() if "log_std" in n] == ["log_std"]


def test_gaussian_actions_are_sampled_raw_and_clipped_only_for_the_env() -> None:
    model = ActorCritic(GAUSSIAN, PolicyConfig(init_log_std=2.0))  # std e^2: samples leave the box
    obs = torch.zeros(256, 3)
    gen = torch.Generator().manual_seed(0)
    actions, logp, _ = model.act(obs, generator=gen)
    assert actions.abs().max() > 2.0  # the raw sample is kept (its log-prob is the one PPO uses) ...
    env = model.env_actions(actions)
    assert env.dtype == np.float32
    assert (env[:, 0] >= -1).all() and (env[:, 0] <= 1).all() and (np.abs(env[:, 1]) <= 2).all()  # ... the env gets it clipped
    assert torch.allclose(logp, model(obs, actions)[0])
    # Seeded generators make sampling reproducible without touching the global RNG.
    again, _, _ = model.act(obs, generator=torch.Generator().manual_seed(0))
    assert torch.equal(actions, again)
    mode, _, _ = model.act(obs, deterministic=True)
    assert torch.equal(mode, model.actor(obs))


def test_observation_normalisation_uses_the_buffers_and_flattens() -> None:
    model = ActorCritic(SpaceSpec(4, "discrete", 2), PolicyConfig(normalize_obs=True, obs_clip=5.0))
    model.obs_rms.update(torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]))
    out = model.prepare_obs(np.full((3, 2, 2), 1.0))  # [B, 2, 2] observations are flattened to [B, 4]
    assert out.shape == (3, 4) and torch.allclose(out, torch.zeros(3, 4), atol=1e-3)
    assert {"obs_rms.mean", "obs_rms.var", "obs_rms.count", "ret_rms.var"} <= set(model.state_dict())
    plain = ActorCritic(SpaceSpec(4, "discrete", 2), PolicyConfig())
    assert torch.equal(plain.prepare_obs(np.ones((1, 4))), torch.ones(1, 4))


def test_state_dependent_log_std_is_a_clamped_second_head() -> None:
    torch.manual_seed(0)
    model = ActorCritic(GAUSSIAN, PolicyConfig(log_std="state_dependent", init_log_std=-1.0, log_std_bounds=(-3.0, 0.5)))
    assert not hasattr(model, "log_std") and model.actor[-1].out_features == 2 * GAUSSIAN.action_dim
    obs = torch.randn(8, 3)
    std = model.distribution(obs).stddev
    assert torch.allclose(std, torch.full((8, 2), math.exp(-1.0)), atol=0.05)  # starts near exp(init_log_std) ...
    assert not torch.equal(std[0], std[1])  # ... but depends on the state
    mean, log_std = model.actor(obs).chunk(2, dim=-1)
    actions = torch.randn(8, 2)
    expected = torch.distributions.Normal(mean, log_std.exp()).log_prob(actions).sum(-1)
    assert torch.allclose(model(obs, actions)[0], expected, atol=1e-5)
    sampled, logp, _ = model.act(obs, generator=torch.Generator().manual_seed(0))  # scored without a Normal
    assert torch.allclose(logp, model(obs, sampled)[0], atol=1e-5)
    with torch.no_grad():
        model.actor[-1].bias[2:] = 10.0  # far above the upper bound
    assert torch.allclose(model.distribution(obs).stddev, torch.full((8, 2), math.exp(0.5)))
    mode, _, _ = model.act(obs, deterministic=True)
    assert torch.equal(mode, model.actor(obs)[:, :2])


def test_log_std_bounds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match=r"log_std_bounds must be \(min, max\) with min < max; got \(1.0, -1.0\)"):
        PolicyConfig(log_std_bounds=(1.0, -1.0))


def test_orthogonal_init_is_a_choice() -> None:
    torch.manual_seed(0)
    ortho, default = (ActorCritic(GAUSSIAN, PolicyConfig(hidden_sizes=[8], orthogonal_init=o)) for o in (True, False))
    w = ortho.actor[0].weight  # [8, 3]: orthogonal columns of norm sqrt(2)
    assert torch.allclose(w.T @ w, 2 * torch.eye(3), atol=1e-5) and not ortho.actor[0].bias.any()
    assert float(ortho.actor[-1].weight.detach().norm(dim=1).max()) == pytest.approx(0.01, rel=1e-3)  # near-uniform start
    assert default.actor[0].bias.any() and float(default.actor[-1].weight.detach().norm(dim=1).max()) > 0.1
