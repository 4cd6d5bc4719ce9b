"""How a learner rank cuts rows: its share of a batch, mini-batches, micro-batches, and no-grad passes over them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from toolbox.rl.batch import RolloutBatch


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


def chunks_of(rows: slice, size: int) -> list[slice]:
    """``rows`` cut into consecutive slices of at most ``size``."""
    start, stop = rows.start or 0, rows.stop
    return [slice(i, min(i + size, stop)) for i in range(start, stop, size)]


@torch.no_grad()
def no_grad_rows(fn: Callable[[RolloutBatch], torch.Tensor], batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """``fn`` over ``batch`` in micro-batches without gradients, concatenated along rows (old / reference
    log-probs, old values): every rank runs the same number of forwards, as FSDP's collectives need."""
    return torch.cat([fn(batch.select(mb)) for mb in chunks_of(slice(0, len(batch)), micro_batch_size)])


def mean_stats(stats: dict[str, list[float]]) -> dict[str, float]:
    """Each metric's mean over the optimizer steps of an update."""
    return {k: sum(v) / len(v) for k, v in stats.items()}


def mini_batches(n: int, epochs: int, parts: int) -> list[slice]:
    """The mini-batches of a PPO-style update, in order: ``epochs`` passes over ``n`` rows cut into ``parts``."""
    return [mini for _ in range(epochs) for mini in split_into(n, parts)]
