"""`GRPOLearner`: one rank of the GRPO learner group (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++).

`plan` runs once per step on rank 0: DAPO's overlong shaping and filter, advantages over
the whole step (REINFORCE++ whitens over the batch) and the step's metrics. `update` runs on
every rank over its own rows only. Plain torch; the `LearnerWorker` actor owns process-group
setup and fetches the rows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from toolbox.algorithms.grpo.config import GRPOUpdate
from toolbox.learner.collective import global_sum, rank, world
from toolbox.learner.config import LearnerConfig
from toolbox.learner.packed import RowForwards, balanced_shares
from toolbox.learner.policy import PolicyRank
from toolbox.learner.rows import chunks_of, mean_stats, mini_batches, no_grad_rows
from toolbox.objectives.policy import policy_objective
from toolbox.objectives.registry import POLICY_LOSSES, PolicyInputs
from toolbox.rewards.base import RewardResult
from toolbox.rl.advantages import grpo_advantages, overlong_shaping
from toolbox.rl.batch import FINISH_LENGTH, RolloutBatch
from toolbox.rl.plan import StepPlan, StepRows, read_step


@dataclass
class GRPOPlan(StepPlan):
    """Per rank, aligned with ``rank_rows``: each row's advantage and whether it is in the loss (``valid``)."""

    advantages: list[torch.Tensor]
    valid: list[torch.Tensor]

    def row_advantages(self) -> torch.Tensor:
        return torch.cat(self.advantages)


class GRPOLearner:
    """One GRPO learner rank. Every public method is collective: all ranks call it together (`plan`: rank 0)."""

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: GRPOUpdate, total_steps: int,
                 old_from_behaviour: bool = False) -> None:
        """``old_from_behaviour``: the loss's ratio is taken against the behaviour log-probs of the batch (the
        engine's, or stored ones) rather than the learner's own log-probs at the start of the update."""
        self.cfg, self.algo, self.old_from_behaviour = cfg, algo, old_from_behaviour
        self.policy = PolicyRank.pretrained(model_path, dtype, cfg, total_steps * algo.ppo_epochs * algo.mini_batches,
                                            frozen_reference=algo.kl_coef > 0, router_loss_coef=algo.moe_aux_loss_coef)
        self.forwards = RowForwards.of(self.policy, cfg.packing, algo.temperature, cfg.share_prompts)
        self.loss = POLICY_LOSSES.build(algo.loss)

    def plan(self, shards: list[RolloutBatch], results: list[RewardResult],
             keep_groups: list[int] | None = None) -> GRPOPlan:
        """Advantages of the whole step (the rollout shards, in order) and each rank's rows.

        ``keep_groups`` (dynamic sampling) names the groups to train on; the others were sampled and dropped.
        """
        step = read_step(shards, results, keep_groups)
        adv_B, valid_B = self._advantages(step)
        step.metrics["adv_abs"] = float(adv_B.abs().mean())
        cuts = (balanced_shares(step.batch, world(), self.forwards.share_prompts) if self.cfg.packing
                else step.shares(world()))
        return GRPOPlan(**step.plan_fields(shards, cuts), advantages=[adv_B[c] for c in cuts],
                        valid=[valid_B[c] for c in cuts])

    def _advantages(self, step: StepRows) -> tuple[torch.Tensor, torch.Tensor]:
        """Per kept row: its advantage (0 outside the loss) and whether it is in the loss.

        Errored and abstained samples are left out of their group's statistics and of the loss (and so of its
        normalisers); a group with fewer than two scored samples contributes nothing.
        """
        a, rewards, batch = self.algo, step.rewards, step.batch
        if a.overlong_buffer:
            shaping = overlong_shaping(batch.response_lengths_B, step.response_width, a.overlong_buffer,
                                       a.overlong_penalty)
            rewards.values_B = rewards.values_B + shaping * rewards.ok_B
        adv_B, valid_B = grpo_advantages(rewards.values_B, a.group_size, a.advantage, rewards.ok_B)
        if a.overlong_filter:
            valid_B = valid_B & (batch.finish_B != FINISH_LENGTH)
        return adv_B * valid_B, valid_B

    def update(self, plan: GRPOPlan, shards: dict[int, RolloutBatch]) -> dict[str, float]:
        """One GRPO step on this rank's rows of ``plan`` (cut from ``shards``, the ones it names); returns metrics."""
        r = rank()
        self.forwards.reset()
        mine, adv_B = plan.gather(r, shards), plan.advantages[r]
        mine.response_mask_BR = mine.response_mask_BR * plan.valid[r].long().unsqueeze(1)
        on_policy = self.algo.ppo_epochs == 1 and self.algo.mini_batches == 1
        old_logp = mine.logprobs_BR if self.old_from_behaviour else (
            None if on_policy else self._no_grad_logprobs(self.policy.model, mine))
        ref_logp = None if self.policy.ref is None else self._no_grad_logprobs(self.policy.ref, mine)
        stats: dict[str, list[float]] = defaultdict(list)
        for mini in mini_batches(len(mine), self.algo.ppo_epochs, self.algo.mini_batches):
            # Dr. GRPO's constant normaliser: the step's padded response width (max_new_tokens at most).
            self._optimizer_step(mine, mini, (adv_B, plan.valid[r]), (old_logp, ref_logp), float(plan.response_width),
                                 stats)
        self.policy.step += 1
        return {**mean_stats(stats), **plan.metrics, **self.forwards.metrics(), **self.policy.router.metrics()}

    def _optimizer_step(self, batch: RolloutBatch, rows: slice, adv_valid: tuple[torch.Tensor, torch.Tensor],
                        old_ref: tuple[torch.Tensor | None, torch.Tensor | None], norm_length: float,
                        stats: dict[str, list[float]]) -> None:
        adv_B, valid_B = adv_valid
        mask = batch.loss_mask_BR[rows]  # the model's own tokens: env/tool tokens are context, not actions
        # Only rows in the loss are sequences of the normaliser: an errored sample's row is masked out.
        counts = global_sum([float(mask.sum()), float(valid_B[rows].sum())])
        # Per-rank share of the global counts: gradients are averaged over ranks, so this makes
        # the update equal to one over the whole global mini-batch.
        tokens, seqs = counts[0] / world(), counts[1] / world()
        old_logp, ref_logp = old_ref
        a = self.algo
        # Micro-batch terms are normalised by the mini-batch's counts, so they add up to its value.
        totals: dict[str, float] = defaultdict(float)
        parts = chunks_of(rows, self.cfg.micro_batch_size)
        for mb in parts:
            part = batch.select(mb)
            logp = self.forwards.logprobs(self.policy.model, part)
            old = logp.detach() if old_logp is None else old_logp[mb]
            ref = None if ref_logp is None else ref_logp[mb]
            x = PolicyInputs(logp, old, adv_B[mb], part.loss_mask_BR, tokens, seqs, norm_length, part.logprobs_BR,
                             a.tis_cap or 0.0)
            terms = policy_objective(self.loss, x, ref, a.kl_coef, a.kl_kind)
            loss = self.policy.router.add(terms.loss, 1.0 / len(parts))
            loss.backward()
            for k, v in {**terms.metrics, "loss": float(loss.detach())}.items():
                totals[k] += v
        for k, v in {**totals, **self.policy.optimizer_step()}.items():
            stats[k].append(v)

    def _no_grad_logprobs(self, model: nn.Module, batch: RolloutBatch) -> torch.Tensor:
        return no_grad_rows(lambda part: self.forwards.logprobs(model, part), batch, self.cfg.micro_batch_size)

