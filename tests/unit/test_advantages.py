"""`toolbox.rl.advantages` against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from toolbox.rl.advantages import ADVANTAGES, EPS, batch_normalized, gae, group_normalized, rloo

REWARDS_BG = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])


def test_group_normalized_hand_case() -> None:
    # Group 0: mean 0.5, population std 0.5. Group 1: mean 2, population std sqrt(2/4).
    s1 = math.sqrt(0.5)
    expected = torch.tensor([
        [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS)],
        [1 / (s1 + EPS), -1 / (s1 + EPS), 0.0, 0.0],
    ])
    torch.testing.assert_close(group_normalized(REWARDS_BG), expected)


def test_group_normalized_without_scale_only_centres() -> None:
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]])
    torch.testing.assert_close(group_normalized(REWARDS_BG, scale=False), expected)
    torch.testing.assert_close(ADVANTAGES.get("group_mean").factory(REWARDS_BG), expected)


def test_equal_group_gets_zero_not_nan() -> None:
    adv = group_normalized(torch.tensor([[0.7, 0.7, 0.7], [0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]))
    assert torch.isfinite(adv).all()
    assert adv[:2].abs().max() == 0.0
    assert adv[2].abs().sum() > 0


@pytest.mark.parametrize("fn", [group_normalized, rloo, lambda r: group_normalized(r, scale=False)])
def test_single_sample_groups_get_zero(fn) -> None:  # noqa: ANN001
    adv = fn(torch.tensor([[1.0], [5.0], [-2.0]]))
    assert adv.shape == (3, 1)
    assert torch.isfinite(adv).all() and adv.abs().max() == 0.0


def test_rloo_hand_case() -> None:
    # Sample 0 of group 0: 1 - mean(0, 0, 1) = 2/3; sample 2 of group 1: 2 - mean(3, 1, 2) = 0.
    expected = torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3], [4 / 3, -4 / 3, 0.0, 0.0]])
    torch.testing.assert_close(rloo(REWARDS_BG), expected)
    # Equivalent form: G / (G - 1) times the group-centred reward.
    torch.testing.assert_close(rloo(REWARDS_BG), 4 / 3 * group_normalized(REWARDS_BG, scale=False))


def test_batch_normalized_hand_case() -> None:
    centered = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]])
    std = math.sqrt((4 * 0.25 + 2) / 8)  # population std over the whole batch; the mean is 0
    torch.testing.assert_close(batch_normalized(REWARDS_BG), centered / (std + EPS))
    adv = batch_normalized(torch.ones(2, 3))
    assert torch.isfinite(adv).all() and adv.abs().max() == 0.0


def test_registered_estimators() -> None:
    assert {"group_norm", "group_mean", "rloo", "reinforce_pp"} <= set(ADVANTAGES.names())
    assert ADVANTAGES.get("group_norm").factory is group_normalized
    assert ADVANTAGES.get("reinforce_pp").factory is batch_normalized


def test_gae_hand_trajectory_with_done_and_bootstrap() -> None:
    gamma, lam = 0.9, 0.8
    # Env 0: the episode ends at t=1 (no bootstrap from V(s_2) into t=1), then a new one runs on,
    # bootstrapped with last_value. Env 1: no done, sparse reward at the end.
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0]])
    dones = torch.tensor([[0, 0], [1, 0], [0, 0]])
    last_value = torch.tensor([2.0, 1.0])
    adv, ret = gae(rewards, values, dones, last_value, gamma, lam)
    # env 0: t2: 3 + .9*2 - 1.5 = 3.3; t1: 2 - 1 = 1 (done); t0: (1 + .9*1 - .5) + .72*1 = 2.12
    # env 1: t2: 1 + .9*1 = 1.9; t1: .72*1.9 = 1.368; t0: .72*1.368 = .98496
    expected = torch.tensor([[2.12, 0.98496], [1.0, 1.368], [3.3, 1.9]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)
    assert dones.dtype == torch.int64  # integer/bool dones are accepted


def test_gae_lambda_one_is_discounted_return_minus_value() -> None:
    rewards = torch.tensor([[1.0], [1.0], [1.0]])
    values = torch.tensor([[0.2], [0.3], [0.4]])
    adv, ret = gae(rewards, values, torch.zeros(3, 1, dtype=torch.bool), torch.tensor([10.0]), gamma=0.5, lam=1.0)
    expected_ret = torch.tensor([[1 + 0.5 + 0.25 + 0.125 * 10], [1 + 0.5 + 0.25 * 10], [1 + 0.5 * 10]])
    torch.testing.assert_close(ret, expected_ret)
    torch.testing.assert_close(adv, expected_ret - values)
