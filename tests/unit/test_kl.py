"""`toolbox.objectives.kl`: Schulman's k1/k2/k3 estimators on hand values."""

from __future__ import annotations

import math

import pytest
import torch

from toolbox.objectives.kl import kl_penalty

LOGP = torch.tensor([-1.0, -2.0, -0.5])
REF = torch.tensor([-1.5, -1.0, -0.5])  # logp - ref = [0.5, -1.0, 0.0]


def test_k1() -> None:
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k1"), torch.tensor([0.5, -1.0, 0.0]))


def test_k2() -> None:
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k2"), torch.tensor([0.125, 0.5, 0.0]))


def test_k3() -> None:
    # exp(ref - logp) - (ref - logp) - 1 with ref - logp = [-0.5, 1.0, 0.0]
    expected = torch.tensor([math.exp(-0.5) + 0.5 - 1, math.e - 2, 0.0])
    torch.testing.assert_close(kl_penalty(LOGP, REF, "k3"), expected)


def test_k3_nonnegative_and_zero_when_equal() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(64, 16, generator=gen) * 5
    ref = -torch.rand(64, 16, generator=gen) * 5
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert kl_penalty(logp, logp.clone(), "k3").abs().max() == 0.0
    assert kl_penalty(logp, logp.clone(), "k2").abs().max() == 0.0


def test_k3_stays_finite_far_off_policy() -> None:
    out = kl_penalty(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(out).all() and out.item() > 0


def test_unknown_kind_raises() -> None:
    with pytest.raises(ValueError, match="'k1', 'k2', 'k3'.*'k4'"):
        kl_penalty(LOGP, REF, "k4")  # type: ignore[arg-type]
