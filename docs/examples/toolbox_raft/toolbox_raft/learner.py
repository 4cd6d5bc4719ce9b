"""`RaftLearner`: one learner rank of RAFT, holding the shared policy component (`PolicyRank`).

`plan` runs once per step on rank 0: it reads the whole step, picks the best-scoring
completion of every group and marks it for the loss when it scores at least ``min_reward``,
then deals the picked rows out to the ranks. `update` runs on every rank over its own rows:
a masked negative log-likelihood of the response tokens, normalised by the step's global
token count so any number of ranks and micro-batches gives the same gradient.
Not covered: packing, KL to a reference, several epochs over a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from toolbox.learner.collective import global_sum, rank, world
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.learner.rows import chunks_of
from toolbox.models.logprobs import response_logprobs
from toolbox.objectives.aggregate import aggregate
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.plan import StepPlan, read_step

from toolbox_raft.config import RaftConfig


@dataclass
class RaftPlan(StepPlan):
    """Per rank, aligned with ``rank_rows`` (one row per group): whether that row is in the loss."""

    in_loss: list[torch.Tensor]


def best_of_groups(rewards: RewardResult, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group: the row index of its best-scoring sample and that reward (``-inf`` if no sample scored)."""
    values_GN = torch.where(rewards.ok_B, rewards.values_B, float("-inf")).view(-1, group_size)
    best_G, pick_G = values_GN.max(dim=1)
    return torch.arange(len(best_G)) * group_size + pick_G, best_G


class RaftLearner:
    """One RAFT learner rank. Every public method is collective (`plan`: rank 0 alone)."""

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: RaftConfig, total_steps: int) -> None:
        self.cfg, self.algo = cfg, algo
        # One optimizer step per training step: that is the length of the learning-rate schedule.
        self.policy = PolicyRank.pretrained(model_path, dtype, cfg, total_steps)

    def plan(self, shards: list[RolloutBatch], results: list[RewardResult],
             keep_groups: list[int] | None = None) -> RaftPlan:
        """The best row of each group (global row numbers) and whether it clears ``min_reward``, cut per rank."""
        step = read_step(shards, results, keep_groups)
        rows_G, best_G = best_of_groups(step.rewards, self.algo.group_size)
        in_loss_G = best_G >= self.algo.min_reward
        step.metrics["raft_best_reward"] = float(best_G[best_G.isfinite()].mean()) if best_G.isfinite().any() else 0.0
        step.metrics["raft_kept_groups"] = float(in_loss_G.float().mean())
        cuts = torch.arange(len(rows_G)).tensor_split(world())  # RaftConfig.check: equal shares
        return RaftPlan(shard_rows=[len(s) for s in shards], rank_rows=[step.kept[rows_G[c]] for c in cuts],
                        response_width=step.response_width, metrics=step.metrics,
                        in_loss=[in_loss_G[c] for c in cuts])

    def update(self, plan: RaftPlan, shards: dict[int, RolloutBatch]) -> dict[str, float]:
        """One supervised step on this rank's picked rows (fetched from ``shards``); returns the step's metrics."""
        r = rank()
        mine = plan.gather(r, shards)
        mask_BR = mine.response_mask_BR * plan.in_loss[r].long().unsqueeze(1)
        tokens = global_sum([float(mask_BR.sum())])[0]
        self.policy.step += 1
        if tokens == 0:  # no group cleared min_reward on any rank: nothing to learn from this step
            return {"sft_loss": 0.0, "sft_tokens": 0.0, **plan.metrics}
        loss = 0.0
        for mb in chunks_of(slice(0, len(mine)), self.cfg.micro_batch_size):
            logp_BR = response_logprobs(self.policy.model, mine.select(mb), self.algo.temperature)
            # This rank's share of the global normaliser: gradients are averaged over ranks.
            nll = aggregate(-logp_BR, mask_BR[mb], "token-mean", token_count=tokens / world())
            nll.backward()
            loss += float(nll.detach())
        stats = self.policy.optimizer_step()
        return {"sft_loss": global_sum([loss])[0] / world(), "sft_tokens": tokens, **stats, **plan.metrics}
