"""Drive an online learner in-process the way the driver and `LearnerWorker` do: `plan` on rank 0, then
`update` with only the shards the plan assigns (one rank here)."""

from __future__ import annotations

from typing import Any

from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


def online_step(learner: Any, shards: list[RolloutBatch], results: list[RewardResult],
                keep_groups: list[int] | None = None) -> dict[str, float]:
    """``learner.plan`` then ``learner.update`` with the shards rank 0 is told to fetch."""
    plan = learner.plan(shards, results, keep_groups)
    return learner.update(plan, {i: shards[i] for i in plan.shards_for(0)})
