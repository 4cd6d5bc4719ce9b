"""`MicroBatcher`: gathers the per-sample calls the reward runner makes from its threads into batched calls.

A `Reward` scores one sample, and `toolbox.rewards.runner.score_samples` calls it from ``reward.run.threads``
threads at once. A reward backed by a model (a reward model, a judge engine) runs far faster on a batch, so it
hands each sample to a `MicroBatcher`: one background thread takes the samples waiting (up to ``max_batch``,
waiting at most ``max_wait_s`` for more after the first) and makes one call for all of them. Batches are
therefore at most ``reward.run.threads`` samples: raise it to batch more. A failing batch call fails each of
its samples with that error (the runner records them as errors, never as 0).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class MicroBatcher(Generic[In, Out]):
    """Call ``fn(items) -> results`` (one result per item, in order) on batches of concurrently submitted items."""

    def __init__(self, fn: Callable[[list[In]], list[Out]], max_batch: int, max_wait_s: float, name: str) -> None:
        self.fn, self.max_batch, self.max_wait_s = fn, max_batch, max_wait_s
        self._queue: queue.SimpleQueue[tuple[In, Future[Out]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"{name}-batcher", daemon=True)
        self._thread.start()
        self.batch_sizes: list[int] = []  # what each call got (tests, metrics)

    def submit(self, item: In) -> Future[Out]:
        """A future of ``item``'s result."""
        future: Future[Out] = Future()
        self._queue.put((item, future))
        return future

    def _take(self) -> list[tuple[In, Future[Out]]]:
        batch = [self._queue.get()]
        while len(batch) < self.max_batch:
            try:
                batch.append(self._queue.get(timeout=self.max_wait_s))
            except queue.Empty:
                break
        return batch

    def _serve(self) -> None:
        while True:
            batch = self._take()
            self.batch_sizes.append(len(batch))
            try:
                results = self.fn([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"batched call returned {len(results)} results for {len(batch)} items")
            except Exception as exc:  # every sample of the batch fails with it; the runner records the reason
                for _, future in batch:
                    future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                future.set_result(result)
