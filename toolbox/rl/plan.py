"""`StepPlan`: what learner rank 0 decides once per online step, so every rank fetches and trains on only its rows.

Rank 0 reads the whole step (every rollout shard and its rewards), computes every
group-level statistic once (advantages, filters, preference pairs, step metrics) and says
which global rows each rank trains on. Each rank then fetches only the shards holding its
rows (`shards_for`) and cuts its rows out of them (`gather`). Rows are numbered globally in
shard order. An algorithm's plan subclasses this with its per-row statistics.

Plain Python and torch: fetching the shards is the actor's job (`toolbox.actors.learner`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from toolbox.core.wire import TensorFields
from toolbox.rewards.base import MAX_REASONS, RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.tracing.entries import StepSamples

log = logging.getLogger(__name__)


@dataclass
class StepPlan(TensorFields):
    """Which global rows each learner rank trains on, plus the step's metrics (the same for every rank).

    ``shard_rows`` counts the rows of each rollout shard, in order. ``rank_rows[r]`` holds the
    ascending global row indices rank ``r`` trains on. ``response_width`` is the padded
    response width of the whole step's batch: a rank's own rows may be narrower, so whatever
    depends on the global width (Dr. GRPO's constant normaliser) reads it from here.
    """

    shard_rows: list[int]
    rank_rows: list[torch.Tensor]
    response_width: int
    metrics: dict[str, float]
    # A few recorded samples of the step (``trainer.log_samples_every``), set by the learner actor when asked.
    samples: StepSamples | None = field(default=None, kw_only=True)

    @property
    def world(self) -> int:
        return len(self.rank_rows)

    def row_advantages(self) -> torch.Tensor | None:
        """Each planned row's advantage, aligned with ``torch.cat(rank_rows)``, for the sample traces; ``None``
        where the plan has none per sample (PPO computes token-level advantages on each rank)."""
        return None

    def shards_for(self, rank: int) -> list[int]:
        """The shards (indices into the step's shard list) that hold rank ``rank``'s rows, ascending."""
        return sorted(set(self._shard_of(self.rank_rows[rank]).tolist()))

    def gather(self, rank: int, shards: dict[int, RolloutBatch]) -> RolloutBatch:
        """Rank ``rank``'s rows, in plan order, cut from the shards it fetched (``{shard index: shard}``)."""
        wanted = self.shards_for(rank)
        missing = [i for i in wanted if i not in shards]
        if missing:
            raise ValueError(f"learner rank {rank}: the step plan needs rollout shards {missing}, "
                             f"which were not fetched (got {sorted(shards)})")
        rows = self.rank_rows[rank]
        starts = torch.tensor([0, *self.shard_rows]).cumsum(0)
        fetched = torch.tensor([self.shard_rows[i] for i in wanted])
        local_start = dict(zip(wanted, (fetched.cumsum(0) - fetched).tolist()))
        shard = self._shard_of(rows)
        local = rows - starts[shard] + torch.tensor([local_start[int(i)] for i in shard], dtype=torch.long)
        return RolloutBatch.concat([shards[i] for i in wanted]).select(local)

    def _shard_of(self, rows: torch.Tensor) -> torch.Tensor:
        ends = torch.tensor(self.shard_rows).cumsum(0)
        return torch.bucketize(rows, ends, right=True)


@dataclass
class StepRows:
    """The whole step as rank 0 reads it: the batch and rewards of the rows it trains on, their global indices
    (``kept``), and the step metrics that do not depend on the update."""

    batch: RolloutBatch
    rewards: RewardResult
    kept: torch.Tensor
    response_width: int
    metrics: dict[str, float]

    def shares(self, world: int, whole: int = 1) -> list[slice]:
        """The kept rows cut into ``world`` equal consecutive shares (positions into ``batch``), each made of
        whole runs of ``whole`` rows (whole groups, where an algorithm pairs within groups)."""
        n = len(self.kept)
        if n % world or (n // world) % whole:
            raise ValueError(f"a step of {n} rows does not split over {world} learner ranks into whole groups of "
                             f"{whole} rows; make algorithm.prompts_per_step a multiple of learner.num_workers")
        size = n // world
        return [slice(r * size, (r + 1) * size) for r in range(world)]

    def plan_fields(self, shards: list[RolloutBatch], cuts: list[slice] | list[torch.Tensor]) -> dict[str, Any]:
        """The `StepPlan` fields of this step for ranks cut as ``cuts``: pass them on with ``**``."""
        return {"shard_rows": [len(s) for s in shards], "rank_rows": [self.kept[c] for c in cuts],
                "response_width": self.response_width, "metrics": self.metrics}


def phase_seconds(batches: list[RolloutBatch], results: list[RewardResult]) -> dict[str, float]:
    """``generate_s`` / ``reward_s``: the longest engine and reward call of a step's shards (they run in parallel);
    ``retries``, when there were any: the calls the rollout and reward workers retried making them."""
    out = {"generate_s": max((b.seconds for b in batches), default=0.0),
           "reward_s": max((r.seconds for r in results), default=0.0)}
    retries = sum(b.retries for b in batches) + sum(r.retries for r in results)
    return {**out, "retries": float(retries)} if retries else out


def read_step(shards: list[RolloutBatch], results: list[RewardResult], keep_groups: list[int] | None) -> StepRows:
    """Concatenate a step's shards and rewards and keep the groups ``keep_groups`` names (all when ``None``).

    Reward metrics cover every sampled row (dropped groups too), ``response_len`` the kept rows. The step's
    first few distinct reward error reasons are logged, and a step with more errors than the rewards'
    ``max_error_rate`` allows raises `RewardErrorRateExceeded` before anything trains on it.
    """
    batch, rewards = RolloutBatch.concat(shards), RewardResult.concat(results)
    reasons = rewards.error_reasons()
    if reasons:
        log.warning("reward errors in %d of %d samples: %s", sum(n for _, n in reasons), len(rewards),
                    "; ".join(f"{n}x {reason}" for reason, n in reasons[:MAX_REASONS]))
    rewards.check_error_rate()
    metrics = {**rewards.metrics(), **phase_seconds(shards, results)}
    width = int(batch.response_ids_BR.shape[1])
    kept = torch.arange(len(batch))
    if keep_groups is not None:
        kept = torch.isin(batch.group_B, torch.tensor(keep_groups)).nonzero().squeeze(1)
        batch, rewards = batch.select(kept), rewards.select(kept)
    metrics["response_len"] = float(batch.response_lengths_B.float().mean())
    metrics.update(token_counts(shards, batch))
    return StepRows(batch, rewards, kept, width, metrics)


def token_counts(shards: list[RolloutBatch], kept: RolloutBatch) -> dict[str, float]:
    """``sampled_tokens`` (response tokens every shard generated), ``samples`` (rows scored), ``train_tokens``
    (prompt and response tokens of the kept rows) and ``train_seq_len`` (their mean length): the counts of the
    step's throughput (`toolbox.learner.throughput`)."""
    lengths_B = kept.prompt_mask_BP.sum(dim=1) + kept.response_mask_BR.sum(dim=1)
    return {"sampled_tokens": float(sum(int(s.response_mask_BR.sum()) for s in shards)),
            "samples": float(sum(len(s) for s in shards)), "train_tokens": float(lengths_B.sum()),
            "train_seq_len": float(lengths_B.float().mean()) if len(kept) else 0.0}
