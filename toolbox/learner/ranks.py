"""What a learner rank is to the `LearnerWorker` actor that holds it: one Protocol per kind of learner.

The worker builds its learner from a picklable factory (``GRPOLearner``, ``SFTLearner``, ``PPOEnvLearner``, a
plugin's) and forwards the driver's calls to it; these Protocols say what each call needs, so a step can be
followed from the trainer through the worker into the learner, and a learner that lacks a method fails at the
call with its name rather than deep inside it. Every kind holds its `PolicyRank` (checkpoints, export, weight
sync go through it).
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

from toolbox.envs.trajectory import TrajectoryBatch
from toolbox.learner.policy import PolicyRank
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.plan import StepPlan

Metrics = dict[str, float]
PlanT = TypeVar("PlanT", bound=StepPlan)


@runtime_checkable
class RankLearner(Protocol):
    """Any learner rank: its policy (model, optimizer, schedule, checkpoints, export)."""

    policy: PolicyRank


@runtime_checkable
class PolicyLearner(RankLearner, Protocol[PlanT]):
    """An online policy learner (GRPO, PPO, online DPO): rank 0 plans the step once, every rank updates on its rows."""

    def plan(self, shards: list[RolloutBatch], results: list[RewardResult],
             keep_groups: list[int] | None = None) -> PlanT:
        """The whole step's statistics (advantages, pairs) and which rows each rank trains on."""
        ...

    def update(self, plan: PlanT, shards: dict[int, RolloutBatch]) -> Metrics:
        """One optimizer step (or PPO epochs) on this rank's rows of the shards ``plan`` assigns it."""
        ...


@runtime_checkable
class OfflineLearner(RankLearner, Protocol):
    """A learner over a fixed dataset (SFT, DPO, reward model): each rank builds its share of a step itself."""

    def update(self, step: int) -> Metrics:
        """One optimizer step on step ``step``'s global batch (this rank's share of it)."""
        ...

    def evaluate(self) -> Metrics:
        """Held-out metrics, no update."""
        ...


@runtime_checkable
class EnvLearner(RankLearner, Protocol):
    """A classic-RL learner (PPO on gymnasium envs): trains on the env runners' trajectories."""

    def update(self, batches: list[TrajectoryBatch]) -> Metrics:
        """PPO epochs on this rank's slice of every runner's trajectories."""
        ...
