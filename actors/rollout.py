"""`RolloutWorker`: a Ray actor shell around an `InferenceEngine`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from toolbox.engines import PromptRequest, SamplingConfig

from .resolve import node_info, resolve, share


class RolloutWorker:
    """Generates rollouts and loads new weights; bulk results go to the object store, the driver gets refs."""

    def __init__(self, rank: int, build: Callable[[int], Any], torch_threads: int = 1) -> None:
        torch.set_num_threads(torch_threads)
        self.rank = rank
        self.engine = build(rank)

    def ready(self) -> dict[str, str]:
        return node_info()

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> dict[str, Any]:
        start = time.perf_counter()
        batch = self.engine.generate(requests, sampling)
        return {"batch": share(batch), "rows": len(batch), "seconds": time.perf_counter() - start}

    def update_weights(self, bucket_refs: list[Any]) -> int:
        return self.engine.update_weights(resolve(bucket_refs))

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.engine.state_dict()
