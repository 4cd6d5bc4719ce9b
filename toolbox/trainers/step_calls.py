"""A step of the online loop while its calls are in flight: each sampling round (`Round`) and the whole step
(`StepCalls`: batches, rewards, update, recorded samples, weight export, the older weight loads its wait takes in).
The loop submits them and waits once; nothing here calls a worker."""

from __future__ import annotations

from dataclasses import dataclass

from toolbox.core.pending import Pending
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.roles import (
    Metrics,
)
from toolbox.tracing.entries import StepSamples


@dataclass
class Round:
    """One sampling round of a step in flight: its batch and rewards, the shards it sent, and the policy version
    (learner steps done) whose weights the rollout workers hold when it runs."""

    batches: Pending[RolloutBatch]
    rewards: Pending[RewardResult]
    shards: list[list[PromptRequest]]
    version: int


@dataclass
class StepCalls:
    """One step's calls in flight: its batches and rewards (with DAPO's rounds and the rows they sampled), the
    policy version that sampled its first round, its update, the samples it records, its weight export and the
    older weight loads its wait takes in."""

    batches: Pending[RolloutBatch]
    rewards: Pending[RewardResult]
    rounds: list[dict[int, bool]]
    rows: int
    version: int
    update: Pending[Metrics]
    samples: list[Pending[StepSamples | None]]
    weights: list[Pending[list]]
    due: list[Pending[float]]
