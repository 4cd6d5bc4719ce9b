"""The policy losses of `POLICY_LOSSES` (``gspo``, ``cispo``, ``ppo_clip``'s dual clip) against hand computations,
and the registry that selects them."""

from __future__ import annotations

import math

import pytest
import torch

from toolbox.objectives.registry import POLICY_LOSSES, PolicyInputs

# Token ratios pi / pi_old: [[1.5, 0.5, (masked)], [1.5, 0.5, 1.2]]; one advantage per sequence.
OLD_BT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]])
RATIO_BT = torch.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 1.2]])
ADV_B = torch.tensor([1.0, -1.0])
MASK_BT = torch.tensor([[1, 1, 0], [1, 1, 1]])


def inputs(logp_BT: torch.Tensor) -> PolicyInputs:
    return PolicyInputs(logp_BT, OLD_BT, ADV_B, MASK_BT, token_count=5.0, seq_count=2.0, norm_length=3.0)


def leaf() -> torch.Tensor:
    return (OLD_BT + RATIO_BT.log()).requires_grad_()


def test_gspo_clips_the_length_normalised_sequence_ratio() -> None:
    loss = POLICY_LOSSES.build({"name": "gspo", "clip_low": 0.02, "clip_high": 0.1})
    logp = leaf()
    terms = loss(inputs(logp))
    # s_0 = (1.5 * 0.5) ^ (1/2) = 0.8660 (A = +1, inside the range: -s_0);
    # s_1 = (1.5 * 0.5 * 1.2) ^ (1/3) = 0.9655 (A = -1, below 1 - 0.02: clipped to 0.98, the pessimistic side).
    s0, s1 = math.sqrt(0.75), 0.9 ** (1 / 3)
    assert s1 < 0.98
    want = (-s0 + 0.98) / 2  # seq-mean-token-mean: each sequence once
    assert terms.loss.item() == pytest.approx(want, rel=1e-6)
    assert terms.metrics["pg_loss"] == pytest.approx(want, rel=1e-6)
    assert terms.metrics["clip_frac"] == pytest.approx(3 / 5)  # the 3 tokens of the clipped sequence
    terms.loss.backward()
    assert logp.grad is not None
    # d/d logp_0t of -s_0 / 2 = -s_0 / 2 * (1 / |y_0|): the sequence's gradient spread evenly over its tokens.
    torch.testing.assert_close(logp.grad, torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [0.0, 0.0, 0.0]]))


def test_gspo_token_form_has_the_sequence_forms_gradient() -> None:
    """The paper's sequence objective, ``mean_i -min(s_i A_i, clip(s_i) A_i)``, written out directly."""
    loss = POLICY_LOSSES.build({"name": "gspo", "clip_low": 0.2, "clip_high": 0.2})
    a, b = leaf(), leaf()
    loss(inputs(a)).loss.backward()
    mask = MASK_BT.float()
    s_B = torch.exp(((b - OLD_BT) * mask).sum(1) / mask.sum(1))
    direct = -torch.minimum(s_B * ADV_B, s_B.clamp(0.8, 1.2) * ADV_B).mean()
    direct.backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)


def test_cispo_weights_reinforce_by_the_clipped_detached_ratio() -> None:
    loss = POLICY_LOSSES.build({"name": "cispo"})  # no lower bound, clip_high 0.28
    logp = leaf()
    terms = loss(inputs(logp))
    # Weights min(r, 1.28): [[1.28, 0.5], [1.28, 0.5, 1.2]]; per token -w * A, token mean over 5 tokens.
    w_BT = torch.tensor([[1.28, 0.5, 0.0], [1.28, 0.5, 1.2]])
    assert terms.loss.item() == pytest.approx((-1.28 - 0.5 + 1.28 + 0.5 + 1.2) / 5, rel=1e-6)
    assert terms.metrics["clip_frac"] == pytest.approx(2 / 5)  # the two tokens of ratio 1.5
    terms.loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, -w_BT * ADV_B.unsqueeze(1) / 5)


def test_cispo_keeps_the_gradient_ppo_clip_drops() -> None:
    """Token (0, 0) has ratio 1.5 > 1.2 and A > 0: the clipped surrogate gives it no gradient, CISPO does."""
    grads = {}
    for name in ("ppo_clip", "cispo"):
        logp = leaf()
        POLICY_LOSSES.build({"name": name})(inputs(logp)).loss.backward()
        assert logp.grad is not None
        grads[name] = logp.grad[0, 0].item()
    assert grads["ppo_clip"] == 0.0 and grads["cispo"] == pytest.approx(-1.28 / 5)


def test_dual_clip_bounds_a_negative_advantages_loss() -> None:
    logp = torch.tensor([[math.log(5.0)]])
    x = PolicyInputs(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), 1.0, 1.0, 1.0)
    # Plain clip: -min(5 * -1, 1.2 * -1) = 5; the dual clip caps it at -3 * A = 3.
    assert POLICY_LOSSES.build({"name": "ppo_clip"})(x).loss.item() == pytest.approx(5.0)
    assert POLICY_LOSSES.build({"name": "ppo_clip", "dual_clip": 3.0})(x).loss.item() == pytest.approx(3.0)


def test_the_registry_lists_every_policy_loss_and_refuses_an_unknown_option() -> None:
    assert {"ppo_clip", "gspo", "cispo"} <= set(POLICY_LOSSES.names())
    with pytest.raises(ValueError, match=r"dual_clip\s+Extra inputs are not permitted"):
        POLICY_LOSSES.build({"name": "gspo", "dual_clip": 3.0})
