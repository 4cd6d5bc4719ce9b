"""The optimizer side of a learner rank: AdamW with a transformers schedule, and the one clipped optimizer step.

`TrainedModel` bundles a (strategy-wrapped) module with its optimizer and schedule, so a
learner with two trained models (PPO's policy and critic) holds two of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from toolbox.learner.checkpoint import load_checkpoint, save_checkpoint
from toolbox.learner.config import OptimConfig


def build_optimizer(model: nn.Module, o: OptimConfig, optimizer_steps: int) -> tuple[torch.optim.Optimizer, LRScheduler]:
    """AdamW and its learning-rate schedule (``transformers.get_scheduler``) over ``optimizer_steps`` steps."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    scheduler = get_scheduler(o.scheduler, optimizer, num_warmup_steps=o.warmup_steps,
                              num_training_steps=max(1, optimizer_steps))
    return optimizer, scheduler


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                   max_grad_norm: float) -> dict[str, float]:
    """Clip the gradient norm, step optimizer and schedule, zero the gradients; returns ``grad_norm`` and ``lr``.

    ``lr`` is the rate this step used. Collective under FSDP (the norm of sharded gradients is reduced).
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    stats = {"grad_norm": float(grad_norm), "lr": float(scheduler.get_last_lr()[0])}
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return stats


class TrainedModel:
    """One trained module of a rank (already wrapped by its strategy), its AdamW and its schedule."""

    def __init__(self, module: nn.Module, optim: OptimConfig, optimizer_steps: int) -> None:
        self.module, self.max_grad_norm = module, optim.max_grad_norm
        self.optimizer, self.scheduler = build_optimizer(module, optim, optimizer_steps)

    def step(self) -> dict[str, float]:
        """`optimizer_step` on this model: clip, step, schedule, zero the gradients. Collective."""
        return optimizer_step(self.module, self.optimizer, self.scheduler, self.max_grad_norm)

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Model, optimizer, schedule and ``extra`` into the directory ``path``. Collective."""
        path.mkdir(parents=True, exist_ok=True)
        save_checkpoint(path, self.module, self.optimizer, {**extra, "scheduler": self.scheduler.state_dict()})

    def load(self, path: Path) -> dict[str, Any]:
        """Restore what `save` wrote; returns the ``extra`` it was given. Collective."""
        extra = load_checkpoint(path, self.module, self.optimizer)
        self.scheduler.load_state_dict(extra.pop("scheduler"))
        return extra
