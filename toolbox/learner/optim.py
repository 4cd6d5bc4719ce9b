"""The optimizer side of a learner rank: the configured optimizer with one of transformers' schedules (`lr_factor`),
and the one clipped optimizer step.

`TrainedModel` bundles a (strategy-wrapped) module with its optimizer and schedule, so a
learner with two trained models (PPO's policy and critic) holds two of them.

A step whose gradient norm is not finite (a NaN/inf loss or gradient) is skipped: the
weights and AdamW moments stay as they were, the schedule still advances (the step's slot
is spent), and the skip is counted (``bad_steps``). Every rank takes the same decision,
because the norm it tests is the global one (reduced over FSDP shards; DDP gradients are
already averaged). ``learner.max_bad_steps`` skipped steps *in a row* fail the run: a rare
spike is survived, a run that only produces garbage is stopped.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from toolbox.core.errors import ToolboxError
from toolbox.learner.config import OptimConfig

log = logging.getLogger(__name__)


class NonFiniteStepsError(ToolboxError):
    """Too many optimizer steps in a row had a non-finite gradient norm (``learner.max_bad_steps``)."""


def build_optimizer(model: nn.Module, o: OptimConfig, optimizer_steps: int) -> tuple[torch.optim.Optimizer, LRScheduler]:
    """The optimizer ``o.name`` selects (`toolbox.learner.optimizers`) and its learning-rate schedule
    (`lr_factor`) over ``optimizer_steps`` steps."""
    from toolbox.learner.optimizers import build

    optimizer = build(model, o)
    factor = partial(lr_factor, kind=o.scheduler, warmup=o.warmup_steps, total=max(1, optimizer_steps))
    return optimizer, LambdaLR(optimizer, factor)


def lr_factor(step: int, *, kind: str, warmup: int, total: int) -> float:
    """The learning rate's factor at ``step`` under the schedule ``kind``: transformers' ``get_scheduler`` schedules
    of these names, the same arithmetic (a checkpoint of either resumes in the other: both are a ``LambdaLR`` over a
    ``partial``). Written out because importing ``transformers.get_scheduler`` imports its Trainer's utilities, peft
    and the modeling code: 3.2 CPU s in a learner rank's start that needs none of them."""
    if kind == "constant":
        return 1.0
    if step < warmup:
        return float(step) / float(max(1, warmup))
    if kind == "constant_with_warmup":
        return 1.0
    if kind == "linear":
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    if kind == "cosine":  # half a cycle, as get_scheduler's default
        progress = float(step - warmup) / float(max(1, total - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"learner.optim.scheduler: unknown schedule {kind!r}")


def adamw_kernel(kernel: str, params: Sequence[torch.Tensor]) -> dict[str, bool]:
    """``torch.optim.AdamW``'s keyword for ``learner.optim.kernel``: ``auto`` is ``fused`` where torch fuses these
    parameters (floating point, all on cpu or cuda; FSDP2's DTensor shards included), else torch's default."""
    if kernel == "auto":
        fusable = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
        return {"fused": True} if params and fusable else {}
    return {kernel: True} if kernel in ("fused", "foreach") else {"foreach": False}


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                   max_grad_norm: float) -> dict[str, float]:
    """Clip the gradient norm and, when it is finite, step the optimizer; step the schedule and zero the
    gradients either way. Returns ``grad_norm``, ``lr`` (the rate this step used) and ``skipped`` (1.0
    when the step was skipped). Collective under FSDP (the norm of sharded gradients is reduced).
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    stats = {"grad_norm": float(grad_norm), "lr": float(scheduler.get_last_lr()[0])}
    finite = math.isfinite(stats["grad_norm"])
    if finite:
        optimizer.step()
    with warnings.catch_warnings():  # a first step skipped: torch warns that the schedule stepped first, on purpose
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()` before")
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    stats["skipped"] = 0.0 if finite else 1.0
    return stats


def replan(scheduler: LRScheduler, optimizer: torch.optim.Optimizer) -> list[float]:
    """Set the optimizer's rates to what ``scheduler``'s own plan gives at its current step; returns them.

    After a checkpoint of a run planned over another length is loaded, the optimizer holds the old
    plan's rate; this continues on the new plan from the same step. (transformers' schedules are
    `LambdaLR`s whose plan is the lambda, which loading a state dict leaves as built.)
    """
    if not isinstance(scheduler, LambdaLR):
        raise TypeError(f"cannot re-plan a {type(scheduler).__name__}; expected a LambdaLR schedule")
    lrs = [float(base * fn(scheduler.last_epoch)) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    last: list[float | torch.Tensor] = list(lrs)
    scheduler._last_lr = last  # noqa: SLF001 - what get_last_lr() reports; set the way LRScheduler.step sets it
    return lrs


class TrainedModel:
    """One trained module of a rank (already wrapped by its strategy), its AdamW and its schedule.

    ``name`` says which model a failure is about (``policy``, ``critic``); ``max_bad_steps`` 0 never fails.
    """

    def __init__(self, module: nn.Module, optim: OptimConfig, optimizer_steps: int, max_bad_steps: int = 3,
                 name: str = "policy") -> None:
        self.module, self.max_grad_norm = module, optim.max_grad_norm
        self.optimizer, self.scheduler = build_optimizer(module, optim, optimizer_steps)
        self.schedule_steps = max(1, optimizer_steps)
        self.max_bad_steps, self.name = max_bad_steps, name
        self.bad_steps = 0  # skipped optimizer steps over the whole run (checkpointed)
        self.bad_in_a_row = 0

    def step(self) -> dict[str, float]:
        """`optimizer_step` on this model (clip, step unless non-finite, schedule, zero the gradients), counting
        skipped steps: adds ``bad_steps`` (the run's total so far). Collective."""
        stats = optimizer_step(self.module, self.optimizer, self.scheduler, self.max_grad_norm)
        if stats["skipped"]:
            self.bad_steps += 1
            self.bad_in_a_row += 1
            log.warning("%s: gradient norm %s is not finite: optimizer step skipped (%d in a row, %d in the run)",
                        self.name, stats["grad_norm"], self.bad_in_a_row, self.bad_steps)
            if self.max_bad_steps and self.bad_in_a_row >= self.max_bad_steps:
                raise NonFiniteStepsError(
                    f"{self.name}: {self.bad_in_a_row} optimizer steps in a row had a non-finite gradient norm "
                    f"(last: {stats['grad_norm']}); each was skipped, so the weights are those of the last good "
                    "step. Look for NaN/inf losses or rewards, or lower learner.optim.lr; learner.max_bad_steps="
                    f"{self.max_bad_steps} sets this limit (0: only skip)")
        else:
            self.bad_in_a_row = 0
        return {**stats, "bad_steps": float(self.bad_steps)}

    def save(self, path: str | Path, extra: dict[str, Any]) -> None:
        """Model, optimizer, schedule (with its planned length), bad-step counts and ``extra`` into the directory
        (or URL) ``path``. Collective."""
        own = {"scheduler": self.scheduler.state_dict(), "schedule_steps": self.schedule_steps,
               "bad_steps": (self.bad_steps, self.bad_in_a_row)}
        from toolbox.learner.checkpoint import save_checkpoint  # DCP: ~1 s of imports the driver never needs

        save_checkpoint(path, self.module, self.optimizer, {**extra, **own})

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore what `save` wrote; returns the ``extra`` it was given. Collective.

        A checkpoint planned over another number of optimizer steps (``trainer.total_steps`` changed)
        continues on this run's plan from the saved step (`replan`).
        """
        from toolbox.learner.checkpoint import load_checkpoint

        extra = load_checkpoint(path, self.module, self.optimizer)
        self.scheduler.load_state_dict(extra.pop("scheduler"))
        self.bad_steps, self.bad_in_a_row = extra.pop("bad_steps", (0, 0))
        saved_steps = extra.pop("schedule_steps", self.schedule_steps)
        if saved_steps != self.schedule_steps:
            replan(self.scheduler, self.optimizer)
        return extra
