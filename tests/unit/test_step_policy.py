"""`NumpyStepPolicy` computes what `ActorCritic`'s torch forward computes (up to float32 rounding), draws the same
actions from the same generator, and reads the model's current parameters; CNN policies keep the torch forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toolbox.envs.step_policy import NumpyStepPolicy, TorchStepPolicy, step_policy
from toolbox.models.mlp import ActorCritic, PolicyConfig, SpaceSpec

DISCRETE = SpaceSpec(obs_dim=5, action_kind="discrete", action_dim=4, action_start=2)
GAUSSIAN = SpaceSpec(obs_dim=5, action_kind="continuous", action_dim=3, low=(-1.0, -2.0, -0.5), high=(1.0, 2.0, 0.5))
CASES = {
    "discrete_tanh": (DISCRETE, PolicyConfig(hidden_sizes=[16, 16])),
    "discrete_relu_normalised": (DISCRETE, PolicyConfig(hidden_sizes=[16], activation="relu", normalize_obs=True)),
    "gaussian_parameter_std": (GAUSSIAN, PolicyConfig(hidden_sizes=[16, 16], init_log_std=0.7, normalize_obs=True,
                                                      obs_clip=1.5)),
    "gaussian_state_dependent": (GAUSSIAN, PolicyConfig(hidden_sizes=[16], log_std="state_dependent",
                                                        log_std_bounds=(-1.0, 0.5), orthogonal_init=False)),
}


def model_for(case: str) -> ActorCritic:
    spec, cfg = CASES[case]
    torch.manual_seed(0)
    model = ActorCritic(spec, cfg).eval().requires_grad_(False)
    model.obs_rms.update(torch.randn(64, spec.obs_dim) * 3 + 1)  # non-trivial statistics (used where normalising)
    return model


@pytest.mark.parametrize("case", sorted(CASES))
def test_numpy_step_equals_the_torch_forward(case: str) -> None:
    model = model_for(case)
    policy = step_policy(model)
    assert isinstance(policy, NumpyStepPolicy)
    obs = np.random.default_rng(1).normal(0, 4, size=(32, model.spec.obs_dim))  # float64, as MuJoCo returns
    x_np = policy.prepare_obs(obs)
    x_torch = model.prepare_obs(obs)
    # The same float32 ops: bit-equal on some CPUs, one unit in the last place apart on others (seen on an AMD EPYC).
    assert x_np.dtype == np.float32
    np.testing.assert_allclose(x_np, x_torch.numpy(), rtol=1e-6, atol=1e-7)
    for deterministic in (False, True):
        a_np, logp_np, v_np = policy.act(x_np, torch.Generator().manual_seed(7), deterministic)
        a_t, logp_t, v_t = model.act(x_torch, deterministic, torch.Generator().manual_seed(7))
        if model.discrete:
            assert a_np.dtype == np.int64 and np.array_equal(a_np, a_t.numpy())
        else:
            assert a_np.dtype == np.float32 and np.allclose(a_np, a_t.numpy(), atol=1e-5)
        assert logp_np.dtype == np.float32 and np.allclose(logp_np, logp_t.numpy(), atol=1e-5)
        assert np.allclose(v_np, v_t.numpy(), atol=1e-5) and np.allclose(policy.value(x_np), v_np)
        # ... and the log-prob is the one the learner computes for these actions
        assert np.allclose(logp_np, model(x_torch, torch.from_numpy(a_np))[0].numpy(), atol=1e-4)
        assert np.array_equal(policy.env_actions(a_np), model.env_actions(torch.from_numpy(a_np)))


def test_it_reads_weights_in_place_and_needs_a_rebuild_only_after_re_pointing() -> None:
    model = model_for("gaussian_parameter_std")
    policy = step_policy(model)
    x = policy.prepare_obs(np.ones((2, 5)))
    before = policy.value(x).copy()
    model.critic[-1].bias.add_(1.0)  # an in-place update (load_state_dict): seen at once
    assert np.allclose(policy.value(x), before + 1.0)
    model.critic[-1].bias.data = model.critic[-1].bias.data + 1.0  # re-pointed, as load_into may do
    assert np.allclose(policy.value(x), before + 1.0)  # the old view ...
    assert np.allclose(step_policy(model).value(x), before + 2.0)  # ... a rebuilt policy reads the new one


def test_cnn_policies_keep_the_torch_forward() -> None:
    spec = SpaceSpec(obs_dim=6 * 6 * 2, action_kind="discrete", action_dim=2, obs_shape=(6, 6, 2))
    cfg = PolicyConfig(encoder="cnn", cnn={"channels": [4], "kernels": [3], "strides": [1], "features": 8})
    model = ActorCritic(spec, cfg).eval().requires_grad_(False)
    policy = step_policy(model)
    assert isinstance(policy, TorchStepPolicy)
    obs = np.random.default_rng(0).random((3, 6, 6, 2))
    actions, logp, value = policy.act(policy.prepare_obs(obs), torch.Generator().manual_seed(0))
    expected = model.act(model.prepare_obs(obs), generator=torch.Generator().manual_seed(0))
    assert all(np.array_equal(a, b.numpy()) for a, b in zip((actions, logp, value), expected))
    assert policy.env_actions(actions).dtype == np.int64
