"""`RewardWorker`: a Ray actor shell around a registered `Reward`."""

from __future__ import annotations

import time
from typing import Any

import torch

from toolbox.models.loading import load_tokenizer
from toolbox.rewards import REWARDS
from toolbox.rewards.base import RewardResult
from toolbox.rewards.runner import RewardRunConfig, decode_samples, score_samples
from toolbox.rl.batch import RolloutBatch

from .resolve import node_info


class RewardWorker:
    """Scores a rollout batch (passed as an object ref, resolved by Ray) into a three-state `RewardResult`."""

    def __init__(self, rank: int, spec: dict[str, Any], run: RewardRunConfig, model_path: str) -> None:
        torch.set_num_threads(1)
        self.rank, self.run = rank, run
        self.reward = REWARDS.build(spec)
        self.tokenizer = load_tokenizer(model_path)

    def ready(self) -> dict[str, str]:
        return node_info()

    def score(self, batch: RolloutBatch) -> RewardResult:
        """The three-state result of every sample of ``batch`` (which Ray fetched from the rollout worker)."""
        start = time.perf_counter()
        result = score_samples(self.reward, decode_samples(batch, self.tokenizer), self.run)
        result.seconds = time.perf_counter() - start
        return result
