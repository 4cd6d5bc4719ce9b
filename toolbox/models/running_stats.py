"""Running mean and variance (parallel Welford / Chan et al.), kept as module buffers.

Buffers, not plain attributes, so the statistics ride along with the weights: the
learner's state dict carries them to the env runners (`toolbox.rl.weights`) and into
DCP checkpoints, and a resumed run normalises exactly as before.
"""

from __future__ import annotations

import torch
from torch import nn


def moments(x_BD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Mean, population variance and count of a batch over its first dimension (float64)."""
    x = x_BD.double()
    return x.mean(dim=0), x.var(dim=0, unbiased=False), float(x.shape[0])


class RunningMeanStd(nn.Module):
    """Mean and variance of everything seen so far, merged batch by batch.

    Starts at mean 0, variance 1 and a tiny pseudo-count, so normalising before the
    first update is the identity.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x_BD: torch.Tensor) -> None:
        """Merge a batch of samples (first dimension = samples)."""
        self.update_from_moments(*moments(x_BD))

    @torch.no_grad()
    def update_from_moments(self, batch_mean: torch.Tensor, batch_var: torch.Tensor, batch_count: float) -> None:
        """Merge a batch summarised by its mean, population variance and count."""
        if batch_count <= 0:
            return
        total = self.count + batch_count
        delta = batch_mean.double() - self.mean
        m2 = self.var * self.count + batch_var.double() * batch_count + delta.pow(2) * self.count * batch_count / total
        self.mean.add_(delta * batch_count / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def normalize(self, x: torch.Tensor, clip: float | None = None, eps: float = 1e-8) -> torch.Tensor:
        """``(x - mean) / sqrt(var + eps)``, optionally clipped to ``[-clip, clip]``; keeps ``x``'s dtype."""
        out = (x - self.mean.to(x.dtype)) / torch.sqrt(self.var.to(x.dtype) + eps)
        return out.clamp(-clip, clip) if clip else out

    def scale(self, x: torch.Tensor, clip: float | None = None, eps: float = 1e-8) -> torch.Tensor:
        """``x / sqrt(var + eps)`` without centring (reward scaling), optionally clipped."""
        out = x / torch.sqrt(self.var.to(x.dtype) + eps)
        return out.clamp(-clip, clip) if clip else out
