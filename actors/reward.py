"""`RewardWorker`: a Ray actor shell around a registered `Reward`."""

from __future__ import annotations

import time
from typing import Any

import torch

from toolbox.models.loading import load_tokenizer
from toolbox.rewards import REWARDS
from toolbox.rewards.runner import RewardRunConfig, decode_samples, score_samples
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.sampling import informative_groups

from .resolve import node_info, share


class RewardWorker:
    """Scores a rollout batch (passed as an object ref, resolved by Ray) into a three-state `RewardResult`."""

    def __init__(self, rank: int, spec: dict[str, Any], run: RewardRunConfig, model_path: str) -> None:
        torch.set_num_threads(1)
        self.rank, self.run = rank, run
        self.reward = REWARDS.build(spec)
        self.tokenizer = load_tokenizer(model_path)

    def ready(self) -> dict[str, str]:
        return node_info()

    def score(self, batch: RolloutBatch) -> dict[str, Any]:
        start = time.perf_counter()
        result = score_samples(self.reward, decode_samples(batch, self.tokenizer), self.run)
        informative = informative_groups(result.values_B, result.ok_B, batch.group_B)
        return {"result": share(result), "metrics": result.metrics(), "informative": informative,
                "seconds": time.perf_counter() - start}
