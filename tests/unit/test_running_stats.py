"""`RunningMeanStd`: batch merges equal the statistics of all the data at once; buffers travel in the state dict."""

from __future__ import annotations

import torch

from toolbox.models.running_stats import RunningMeanStd, moments


def test_merged_batches_equal_the_whole() -> None:
    torch.manual_seed(0)
    data = torch.randn(1000, 3).double() * torch.tensor([1.0, 5.0, 0.1]).double() + torch.tensor([2.0, -1.0, 7.0]).double()
    rms = RunningMeanStd((3,), epsilon=0.0)
    for chunk in data.split([1, 10, 300, 689]):
        rms.update(chunk)
    assert torch.allclose(rms.mean, data.mean(0))
    assert torch.allclose(rms.var, data.var(0, unbiased=False))
    assert float(rms.count) == 1000


def test_update_from_moments_equals_update() -> None:
    a, b = RunningMeanStd((2,)), RunningMeanStd((2,))
    x = torch.randn(50, 2)
    a.update(x)
    b.update_from_moments(*moments(x))
    assert torch.equal(a.mean, b.mean) and torch.equal(a.var, b.var) and torch.equal(a.count, b.count)


def test_fresh_stats_normalise_as_identity_and_clip() -> None:
    rms = RunningMeanStd((2,))
    x = torch.tensor([[0.5, -3.0]])
    assert torch.allclose(rms.normalize(x), x, atol=1e-6)
    assert rms.normalize(torch.tensor([[100.0, -100.0]]), clip=10.0).abs().max() == 10.0
    assert rms.normalize(x).dtype == torch.float32


def test_scale_divides_by_std_without_centring() -> None:
    rms = RunningMeanStd(())
    rms.update(torch.tensor([10.0, 14.0]))  # mean ~12, std ~2
    assert abs(float(rms.scale(torch.tensor(4.0))) - 2.0) < 1e-2


def test_stats_are_buffers_in_the_state_dict() -> None:
    rms = RunningMeanStd((4,))
    assert set(rms.state_dict()) == {"mean", "var", "count"}
    assert not list(rms.parameters())
