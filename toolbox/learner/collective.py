"""Collective helpers of a learner rank: its rank and world size, and element-wise reductions over all ranks.

Without a process group (strategy ``single``) the rank is 0, the world is 1 and a reduction
returns this rank's values. Every reduction is collective: all ranks call it together.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from toolbox.learner.strategy import is_distributed


def rank() -> int:
    """This process's rank in the learner group (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def world() -> int:
    """The number of learner ranks (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def global_sum(values: Iterable[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def global_max(value: float) -> float:
    """The largest ``value`` any rank holds."""
    return _all_reduce([value], dist.ReduceOp.MAX)[0]


def global_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    """Mean of ``x_BT`` over the positions ``mask_BT`` selects on every rank (0 when there are none)."""
    total, n = global_sum([float((x_BT * mask_BT).sum()), float(mask_BT.sum())])
    return total / max(n, 1.0)


def _all_reduce(values: Iterable[float], op: dist.ReduceOp.RedOpType) -> list[float]:
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if is_distributed():
        dist.all_reduce(t, op=op)
    return t.tolist()
