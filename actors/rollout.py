"""`RolloutWorker`: a Ray actor shell around an `InferenceEngine`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from toolbox.engines import SamplingConfig
from toolbox.rl.batch import PromptRequest, RolloutBatch

from .resolve import node_info, resolve


class RolloutWorker:
    """Generates rollouts and loads new weights; the driver only ever holds refs to its batches."""

    def __init__(self, rank: int, build: Callable[[int], Any], torch_threads: int = 1) -> None:
        torch.set_num_threads(torch_threads)
        self.rank = rank
        self.engine = build(rank)

    def ready(self) -> dict[str, str]:
        return node_info()

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        """The batch itself: Ray stores it, and the driver passes the ref on to reward and learner calls."""
        start = time.perf_counter()
        batch = self.engine.generate(requests, sampling)
        batch.seconds = time.perf_counter() - start
        return batch

    def update_weights(self, bucket_refs: list[Any]) -> float:
        """Load the exported buckets; returns the seconds it took."""
        start = time.perf_counter()
        self.engine.update_weights(resolve(bucket_refs))
        return time.perf_counter() - start

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict()
