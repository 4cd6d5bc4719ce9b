"""`LearnerBase`: what every LLM learner rank shares — model load + wrap, optimizer, scheduler, the optimizer
step, global counts, weight export and checkpoints. An algorithm's learner adds its ``update``.

Plain torch; the `LearnerWorker` actor owns process-group setup and builds a subclass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from toolbox.learner.checkpoint import load_checkpoint, save_checkpoint
from toolbox.learner.config import LearnerConfig, OptimConfig
from toolbox.learner.strategy import full_state_dict, is_distributed, wrap
from toolbox.models.loading import load_causal_lm
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.weights import WeightBucket, pack_state_dict


def build_optimizer(model: nn.Module, o: OptimConfig, optimizer_steps: int) -> tuple[torch.optim.Optimizer, LRScheduler]:
    """AdamW and its learning-rate schedule over ``optimizer_steps`` steps."""
    from transformers import get_scheduler

    optimizer = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)
    scheduler = get_scheduler(o.scheduler, optimizer, num_warmup_steps=o.warmup_steps,
                              num_training_steps=max(1, optimizer_steps))
    return optimizer, scheduler


class TrainableRank:
    """One rank's trained module (already wrapped by its strategy), optimizer and schedule, whatever the model.

    What every learner shares: rank and world size, global reductions, the clipped
    optimizer step, weight export, and checkpoints. Every public method is collective:
    all ranks call it together.
    """

    def __init__(self, cfg: LearnerConfig, policy: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: LRScheduler) -> None:
        self.cfg = cfg
        self.rank = dist.get_rank() if is_distributed() else 0
        self.world = dist.get_world_size() if is_distributed() else 1
        self.policy, self.optimizer, self.scheduler = policy, optimizer, scheduler
        self.step = 0

    def global_sum(self, values: Iterable[float]) -> list[float]:
        """Element-wise sum of ``values`` over all ranks (this rank's values alone without a process group)."""
        return _all_reduce(values, dist.ReduceOp.SUM)

    def global_max(self, value: float) -> float:
        """The largest ``value`` any rank holds."""
        return _all_reduce([value], dist.ReduceOp.MAX)[0]

    def optimizer_step(self, model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                       scheduler: LRScheduler | None = None) -> dict[str, float]:
        """Clip the gradient norm, step optimizer and schedule, zero the gradients; returns grad_norm and lr.

        Defaults to the policy; a learner with a second trained model (a critic) passes its own.
        """
        model, optimizer = model or self.policy, optimizer or self.optimizer
        scheduler = scheduler or self.scheduler
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.optim.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        stats = {"grad_norm": float(grad_norm), "lr": float(scheduler.get_last_lr()[0])}
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return stats

    # ---- weights and checkpoints ------------------------------------------------------------
    def export_weights(self) -> list[WeightBucket]:
        """Full weights as buckets on rank 0; ``[]`` on other ranks."""
        state = full_state_dict(self.policy)
        return pack_state_dict(state, self.cfg.bucket_mb << 20) if self.rank == 0 else []

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return full_state_dict(self.policy)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        return save_checkpoint(path, self.policy, self.optimizer, {"step": self.step, "scheduler": self.scheduler.state_dict()})

    def load(self, path: str | Path) -> int:
        extra = load_checkpoint(Path(path), self.policy, self.optimizer)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.step = int(extra["step"])
        return self.step


class LearnerBase(TrainableRank):
    """A language-model learner rank: the policy loaded with ``from_pretrained`` and wrapped by the strategy,
    AdamW with a transformers schedule, and optionally a frozen reference copy."""

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, optimizer_steps: int,
                 frozen_reference: bool = False) -> None:
        self.model_path, self.dtype = model_path, dtype
        policy = wrap(load_causal_lm(model_path, dtype).train(), cfg.strategy)
        super().__init__(cfg, policy, *build_optimizer(policy, cfg.optim, optimizer_steps))
        self.ref = self.frozen_copy() if frozen_reference else None

    def frozen_copy(self) -> nn.Module:
        """A fresh, frozen copy of the initial model, wrapped like the policy (the reference)."""
        return wrap(load_causal_lm(self.model_path, self.dtype).eval().requires_grad_(False), self.cfg.strategy)


def _all_reduce(values: Iterable[float], op: dist.ReduceOp.RedOpType) -> list[float]:
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if is_distributed():
        dist.all_reduce(t, op=op)
    return t.tolist()


def rank_slice(n: int, rank: int, world: int) -> slice:
    """This rank's contiguous share of ``n`` rows (which must split evenly)."""
    if n % world:
        raise ValueError(f"a batch of {n} rows does not split evenly over {world} learner ranks")
    size = n // world
    return slice(rank * size, (rank + 1) * size)


def split_into(n: int, parts: int) -> list[slice]:
    """``range(n)`` cut into ``parts`` consecutive slices (the last may be shorter)."""
    size = -(-n // parts)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


@torch.no_grad()
def no_grad_rows(fn: Callable[[RolloutBatch], torch.Tensor], batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """``fn`` over ``batch`` in micro-batches without gradients, concatenated along rows (old / reference
    log-probs, old values): every rank runs the same number of forwards, as FSDP's collectives need."""
    return torch.cat([fn(batch.select(mb)) for mb in chunks_of(slice(0, len(batch)), micro_batch_size)])


def chunks_of(rows: slice, size: int) -> list[slice]:
    """``rows`` cut into consecutive slices of at most ``size``."""
    start, stop = rows.start or 0, rows.stop
    return [slice(i, min(i + size, stop)) for i in range(start, stop, size)]
