"""`RewardWorker`: a Ray actor shell around a registered `Reward`."""

from __future__ import annotations

import time
from typing import Any

import torch

from toolbox.core.retry import take_retries
from toolbox.core.seeding import rng_state, set_rng_state
from toolbox.models.loading import load_tokenizer
from toolbox.rewards import REWARDS
from toolbox.rewards.base import RewardResult
from toolbox.rewards.runner import RewardRunConfig, decode_samples, score_samples
from toolbox.rl.batch import RolloutBatch

from .resolve import node_info
from .supervisor import recover


class RewardWorker:
    """Scores a rollout batch (passed as an object ref, resolved by Ray) into a three-state `RewardResult`."""

    def __init__(self, rank: int, spec: dict[str, Any], run: RewardRunConfig, model_path: str,
                 supervisor: str | None = None) -> None:
        """``supervisor`` (the name of a restartable group's `Supervisor`) counts this rank's restarts; a reward
        keeps no state between calls, so the calls Ray retries after a restart need nothing more."""
        torch.set_num_threads(1)
        self.rank, self.run = rank, run
        self.reward = REWARDS.build(spec)
        self.tokenizer = load_tokenizer(model_path)
        recover(supervisor, rank)

    def ready(self) -> dict[str, str]:
        return node_info()

    def score(self, batch: RolloutBatch) -> RewardResult:
        """The three-state result of every sample of ``batch`` (which Ray fetched from the rollout worker)."""
        start = time.perf_counter()
        result = score_samples(self.reward, decode_samples(batch, self.tokenizer), self.run)
        result.seconds, result.retries = time.perf_counter() - start, take_retries()
        return result

    def get_state(self) -> dict[str, Any]:
        """This process's RNG streams (a reward that samples, e.g. a judge), for a checkpoint."""
        return {"rng": rng_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        set_rng_state(state["rng"])
