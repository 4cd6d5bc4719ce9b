"""`toolbox.objectives.preference`: DPO / IPO / hinge losses on hand-computed cases and edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from toolbox.objectives.preference import dpo_loss, implicit_rewards, preference_logits


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


# One pair: policy prefers chosen by 3 nats, the reference by 1, so h = 2.
PC, PR, RC, RR = t(-1.0), t(-4.0), t(-2.0), t(-3.0)


def test_preference_logits_and_implicit_rewards() -> None:
    assert preference_logits(PC, PR, RC, RR).item() == pytest.approx(2.0)
    assert implicit_rewards(PC, RC, 0.5).item() == pytest.approx(0.5)  # 0.5 * (-1 - -2)
    assert implicit_rewards(PR, RR, 0.5).item() == pytest.approx(-0.5)


def test_sigmoid_hand_computed() -> None:
    # beta h = 0.2: -log sigmoid(0.2) = log(1 + e^-0.2)
    assert dpo_loss(PC, PR, RC, RR, beta=0.1).item() == pytest.approx(math.log1p(math.exp(-0.2)), rel=1e-12)


def test_sigmoid_label_smoothing_is_conservative_dpo() -> None:
    eps, z = 0.1, 0.2
    expected = (1 - eps) * math.log1p(math.exp(-z)) + eps * math.log1p(math.exp(z))
    assert dpo_loss(PC, PR, RC, RR, beta=0.1, label_smoothing=eps).item() == pytest.approx(expected, rel=1e-12)


def test_ipo_and_hinge_hand_computed() -> None:
    # ipo: (h - 1 / (2 beta))^2 = (2 - 5)^2; hinge: max(0, 1 - beta h) = 0.8
    assert dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="ipo").item() == pytest.approx(9.0)
    assert dpo_loss(PC, PR, RC, RR, beta=0.1, loss_type="hinge").item() == pytest.approx(0.8)
    assert dpo_loss(PC, PR, RC, RR, beta=1.0, loss_type="hinge").item() == 0.0  # margin met: no loss


def test_equal_policy_and_reference_give_log2_and_zero_margin() -> None:
    x = t(-3.0, -1.0, -7.5)
    y = t(-2.0, -4.0, -0.5)
    loss = dpo_loss(x, y, x, y, beta=0.3)
    assert loss.shape == (3,)
    assert torch.allclose(loss, torch.full((3,), math.log(2.0), dtype=torch.float64))


def test_per_pair_shape_and_gradient_pushes_chosen_up() -> None:
    pc = t(-1.0, -2.0).requires_grad_()
    pr = t(-1.5, -0.5).requires_grad_()
    loss = dpo_loss(pc, pr, t(-1.0, -1.0), t(-1.0, -1.0), beta=0.5)
    assert loss.shape == (2,)
    loss.sum().backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()


def test_empty_batch_and_extreme_logits_stay_finite() -> None:
    assert dpo_loss(t(), t(), t(), t(), beta=0.1).shape == (0,)
    big = dpo_loss(t(0.0), t(-1e6), t(0.0), t(0.0), beta=1.0)
    small = dpo_loss(t(-1e6), t(0.0), t(0.0), t(0.0), beta=1.0)
    assert big.item() == pytest.approx(0.0) and small.item() == pytest.approx(1e6)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"beta": 0.0}, "beta"),
    ({"beta": 0.1, "label_smoothing": 0.6}, r"\[0, 0.5\]"),
    ({"beta": 0.1, "loss_type": "ipo", "label_smoothing": 0.1}, r"label_smoothing\s+Extra inputs are not permitted"),
    ({"beta": 0.1, "loss_type": "kto"}, r"'kto' is not a registered preference loss; allowed: \['hinge', 'ipo', 'sigmoid'\]"),
])
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dpo_loss(PC, PR, RC, RR, **kwargs)
