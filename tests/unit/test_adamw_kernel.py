"""``learner.optim.kernel``: which torch AdamW implementation a learner builds, and that they agree."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from toolbox.learner.config import OptimConfig
from toolbox.learner.optim import adamw_kernel, build_optimizer, optimizer_step


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


@pytest.mark.parametrize(("kernel", "flag"), [("auto", "fused"), ("fused", "fused"), ("foreach", "foreach")])
def test_kernel_picks_the_torch_implementation(kernel: str, flag: str) -> None:
    optimizer, _ = build_optimizer(_model(), OptimConfig(kernel=kernel), 10)  # type: ignore[arg-type]
    assert optimizer.param_groups[0][flag] is True


def test_auto_falls_back_where_torch_cannot_fuse() -> None:
    assert adamw_kernel("auto", [torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.int64)]) == {}
    assert adamw_kernel("auto", []) == {}
    assert adamw_kernel("for_loop", [torch.zeros(2)]) == {"foreach": False}


def test_fused_steps_match_the_per_tensor_loop() -> None:
    """Same data, same schedule: fused and for_loop AdamW end at the same weights up to float rounding."""
    x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.randn(32, 4)
    ends = []
    for kernel in ("fused", "for_loop"):
        model = _model()
        optimizer, scheduler = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1, kernel=kernel), 5)  # type: ignore[arg-type]
        for _ in range(5):
            nn.functional.mse_loss(model(x), y).backward()
            optimizer_step(model, optimizer, scheduler, max_grad_norm=1.0)
        ends.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    start = torch.cat([p.detach().flatten() for p in _model().parameters()])
    assert (ends[0] - start).abs().max() > 1e-3  # the steps moved the weights
    torch.testing.assert_close(ends[0], ends[1], rtol=1e-5, atol=1e-6)


def test_train_step_bench_times_the_three_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolbox.bench import grpo_train_vs_trl, learner_step

    monkeypatch.setitem(learner_step.CASES, "nano", learner_step.Case((16, 1, 2, 1, 32), 16, 4, 2, (2, 4), (1, 6), 4, 0.0))
    got = grpo_train_vs_trl.measure("nano", rounds=1, short=64)
    assert all(0 < got[f"{side}_cpu_s"] < float("inf") for side in grpo_train_vs_trl.SIDES)
    assert got["toolbox_vs_before"] > 0 and got["toolbox_vs_trl_style"] > 0
