"""`toolbox.objectives.policy` and `aggregate`: clipped surrogate and the reductions, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from toolbox.objectives.aggregate import aggregate
from toolbox.objectives.policy import clipped_policy_loss, clipped_policy_terms

CLIP_LOW, CLIP_HIGH = 0.2, 0.3  # ratio clipped to [0.8, 1.3]
# Row 0 has advantage +1, row 1 has -1. Ratios per token: row 0 [1.5, 0.5, 1.0], row 1 [1.5, 0.5, 1.2].
RATIO_BT = torch.tensor([[1.5, 0.5, 1.0], [1.5, 0.5, 1.2]])
OLD_BT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.2]])
LOGP_BT = OLD_BT + RATIO_BT.log()
ADV_B = torch.tensor([1.0, -1.0])
MASK_BT = torch.tensor([[1, 1, 0], [1, 1, 1]])
# A>0: -min(r, clip(r)) -> 1.5 clipped to 1.3, 0.5 kept. A<0: -min(-r, -clip(r)) -> 1.5 kept, 0.5 clipped to 0.8.
LOSS_BT = torch.tensor([[-1.3, -0.5, -1.0], [1.5, 0.8, 1.2]])
CLIPPED_BT = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


def test_terms_hand_case_positive_and_negative_advantages() -> None:
    loss_BT, clipped_BT = clipped_policy_terms(LOGP_BT, OLD_BT, ADV_B, CLIP_LOW, CLIP_HIGH)
    torch.testing.assert_close(loss_BT, LOSS_BT)
    torch.testing.assert_close(clipped_BT, CLIPPED_BT)


def test_asymmetric_clip_matters() -> None:
    # With a symmetric 0.2 range the +1 advantage token is clipped at 1.2, not 1.3.
    loss_BT, _ = clipped_policy_terms(LOGP_BT, OLD_BT, ADV_B, 0.2, 0.2)
    assert loss_BT[0, 0].item() == pytest.approx(-1.2)
    assert loss_BT[1, 1].item() == pytest.approx(0.8)


def test_clipped_loss_token_mean() -> None:
    loss = clipped_policy_loss(LOGP_BT, OLD_BT, ADV_B, MASK_BT, CLIP_LOW, CLIP_HIGH)
    assert loss.item() == pytest.approx((-1.3 - 0.5 + 1.5 + 0.8 + 1.2) / 5)


def test_per_sequence_advantages_broadcast() -> None:
    adv_BT = ADV_B.unsqueeze(1).expand(2, 3).clone()
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        a = clipped_policy_loss(LOGP_BT, OLD_BT, ADV_B, MASK_BT, CLIP_LOW, CLIP_HIGH, agg=agg)
        b = clipped_policy_loss(LOGP_BT, OLD_BT, adv_BT, MASK_BT, CLIP_LOW, CLIP_HIGH, agg=agg)
        torch.testing.assert_close(a, b)


def test_gradient_flows_only_where_unclipped() -> None:
    logp = LOGP_BT.clone().requires_grad_(True)
    clipped_policy_loss(logp, OLD_BT, ADV_B, torch.ones(2, 3), CLIP_LOW, CLIP_HIGH).backward()
    # d(-r*A)/dlogp = -r*A / N where unclipped; 0 where the clip is active.
    expected = torch.tensor([[0.0, -0.5, -1.0], [1.5, 0.0, 1.2]]) / 6
    torch.testing.assert_close(logp.grad, expected)


ROW0, ROW1 = (-1.3 - 0.5), (1.5 + 0.8 + 1.2)  # masked row sums: -1.8, 3.5


@pytest.mark.parametrize(
    ("agg", "kwargs", "expected"),
    [
        ("token-mean", {}, (ROW0 + ROW1) / 5),
        ("token-mean", {"token_count": 10.0}, (ROW0 + ROW1) / 10),
        ("seq-mean-token-mean", {}, (ROW0 / 2 + ROW1 / 3) / 2),
        ("seq-mean-token-mean", {"seq_count": 4.0}, (ROW0 / 2 + ROW1 / 3) / 4),
        ("seq-mean-token-sum", {}, (ROW0 + ROW1) / 2),
        ("seq-mean-token-sum-norm", {}, (ROW0 / 3 + ROW1 / 3) / 2),
        ("seq-mean-token-sum-norm", {"norm_length": 4.0}, (ROW0 / 4 + ROW1 / 4) / 2),
    ],
)
def test_aggregate_modes(agg: str, kwargs: dict, expected: float) -> None:
    assert aggregate(LOSS_BT, MASK_BT, agg, **kwargs).item() == pytest.approx(expected)  # type: ignore[arg-type]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_empty_mask_gives_zero_not_nan(agg: str) -> None:
    logp = LOGP_BT.clone().requires_grad_(True)
    loss = clipped_policy_loss(logp, OLD_BT, ADV_B, torch.zeros(2, 3), CLIP_LOW, CLIP_HIGH, agg=agg)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad.abs().max() == 0.0
    empty = aggregate(torch.zeros(0, 3), torch.zeros(0, 3), agg)  # type: ignore[arg-type]
    assert not math.isnan(empty.item())


def test_unknown_aggregation() -> None:
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        aggregate(LOSS_BT, MASK_BT, "mean")  # type: ignore[arg-type]
