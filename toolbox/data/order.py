"""Deterministic epochs over a finite dataset: position ``i`` of the stream is one row, the same in every process.

Epoch ``e`` visits every row once, in an order shuffled from ``(seed, e)``; stream position ``i`` is
row ``order(i // size)[i % size]``. A consumer derives positions from the step (step ``k`` of ``n``
rows reads ``[k * n, (k + 1) * n)``), so a resumed run, or another learner rank, reads exactly what
a process that ran from the start would.
"""

from __future__ import annotations

import random


class EpochOrder:
    """Stream positions -> row indices, reshuffled each epoch from the seed."""

    def __init__(self, size: int, seed: int | str, salt: str = "epoch") -> None:
        if size < 1:
            raise ValueError("EpochOrder needs at least one row")
        self.size, self.seed, self.salt = size, seed, salt
        self._orders: dict[int, list[int]] = {}

    def indices(self, start: int, n: int) -> list[int]:
        """Row indices at stream positions ``[start, start + n)`` (may span epochs)."""
        return [self.order(i // self.size)[i % self.size] for i in range(start, start + n)]

    def order(self, epoch: int) -> list[int]:
        """The permutation of rows visited in ``epoch``."""
        if epoch not in self._orders:
            order = list(range(self.size))
            random.Random(f"{self.seed}/{self.salt}/{epoch}").shuffle(order)
            # Steps move forward: orders of epochs before the previous one are never needed again.
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = order
        return self._orders[epoch]
