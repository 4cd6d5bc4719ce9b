"""`GRPOLearner`: one rank of the GRPO learner group (model, reference, optimizer, GRPO update).

Plain torch; the `LearnerWorker` actor owns process-group setup and calls this.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from toolbox.algorithms.grpo.config import GRPOConfig
from toolbox.learner.base import LearnerBase, chunks_of, no_grad_rows, rank_slice, split_into
from toolbox.learner.config import LearnerConfig
from toolbox.objectives.grpo import grpo_loss
from toolbox.rewards.base import RewardResult
from toolbox.rl.advantages import grpo_advantages, overlong_shaping
from toolbox.rl.batch import FINISH_LENGTH, RolloutBatch


def sequence_logprobs(model: nn.Module, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """``log p(response token | prefix)`` for every response position, ``[B, R]`` (0 at padding)."""
    ids, attn, position_ids = batch.model_inputs()
    logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, use_cache=False).logits
    p = batch.prompt_ids_BP.shape[1]
    logits_BRV = logits[:, p - 1 : -1].float() / temperature
    logp = torch.log_softmax(logits_BRV, dim=-1).gather(-1, batch.response_ids_BR.unsqueeze(-1)).squeeze(-1)
    return logp * batch.response_mask_BR


class GRPOLearner(LearnerBase):
    """One GRPO learner rank. Every public method is collective: all ranks call it together."""

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: GRPOConfig, total_steps: int) -> None:
        super().__init__(model_path, dtype, cfg, total_steps * algo.ppo_epochs * algo.mini_batches,
                         frozen_reference=algo.kl_coef > 0)
        self.algo = algo

    # ---- the update -------------------------------------------------------------------------
    def update(self, batches: list[RolloutBatch], results: list[RewardResult],
               keep_groups: list[int] | None = None) -> dict[str, float]:
        """One GRPO step on this rank's slice of the global batch (the rollout shards, in order); returns metrics.

        Every rank reads the whole batch: group normalisation needs whole groups, and
        the batch of a step is small next to the model. ``keep_groups`` (dynamic
        sampling) names the groups to train on; the others were sampled and dropped.
        """
        batch, rewards = RolloutBatch.concat(batches), RewardResult.concat(results)
        reward_metrics = rewards.metrics()
        if keep_groups is not None:
            kept = torch.isin(batch.group_B, torch.tensor(keep_groups)).nonzero().squeeze(1)
            batch, rewards = batch.select(kept), rewards.select(kept)
        a = self.algo
        if a.overlong_buffer:
            shaping = overlong_shaping(batch.response_lengths_B, batch.response_ids_BR.shape[1], a.overlong_buffer,
                                       a.overlong_penalty)
            rewards.values_B = rewards.values_B + shaping * rewards.ok_B
        valid_B = rewards.ok_B
        if a.overlong_filter:
            valid_B = valid_B & (batch.finish_B != FINISH_LENGTH)
        adv_B = grpo_advantages(_fill_invalid(rewards, self.algo.group_size), self.algo.group_size, self.algo.advantage)
        adv_B = adv_B * valid_B
        rows = rank_slice(len(batch), self.rank, self.world)
        mine, adv_mine = batch.select(rows), adv_B[rows]
        mine.response_mask_BR = mine.response_mask_BR * valid_B[rows].long().unsqueeze(1)
        on_policy = self.algo.ppo_epochs == 1 and self.algo.mini_batches == 1
        old_logp = None if on_policy else self._no_grad_logprobs(self.policy, mine)
        ref_logp = None if self.ref is None else self._no_grad_logprobs(self.ref, mine)
        stats: dict[str, list[float]] = defaultdict(list)
        for _ in range(self.algo.ppo_epochs):
            for mini in split_into(len(mine), self.algo.mini_batches):
                self._optimizer_step(mine, mini, adv_mine, old_logp, ref_logp, stats)
        self.step += 1
        metrics = {k: sum(v) / len(v) for k, v in stats.items()}
        metrics.update(reward_metrics)
        metrics["response_len"] = float(batch.response_lengths_B.float().mean())
        metrics["adv_abs"] = float(adv_B.abs().mean())
        return metrics

    def _optimizer_step(self, batch: RolloutBatch, rows: slice, adv_B: torch.Tensor, old_logp: torch.Tensor | None,
                        ref_logp: torch.Tensor | None, stats: dict[str, list[float]]) -> None:
        mask = batch.response_mask_BR[rows]
        counts = self.global_sum([float(mask.sum()), float(mask.shape[0])])
        # Per-rank share of the global counts: gradients are averaged over ranks, so this makes
        # the update equal to one over the whole global mini-batch.
        tokens, seqs = counts[0] / self.world, counts[1] / self.world
        # Dr. GRPO's constant normaliser: the padded response width (max_new_tokens at most).
        norm_length = float(batch.response_ids_BR.shape[1])
        # Micro-batch terms are normalised by the mini-batch's counts, so they add up to its value.
        totals: dict[str, float] = defaultdict(float)
        for mb in chunks_of(rows, self.cfg.micro_batch_size):
            part = batch.select(mb)
            logp = sequence_logprobs(self.policy, part, self.algo.temperature)
            old = logp.detach() if old_logp is None else old_logp[mb]
            ref = None if ref_logp is None else ref_logp[mb]
            a = self.algo
            terms = grpo_loss(logp, old, ref, adv_B[mb], part.response_mask_BR, tokens, seqs, norm_length,
                              clip_low=a.clip_low, clip_high=a.clip_high, agg=a.agg, kl_coef=a.kl_coef, kl_kind=a.kl_kind)
            terms.loss.backward()
            for k, v in (("pg_loss", terms.pg_loss), ("kl", terms.kl), ("clip_frac", terms.clip_frac),
                         ("loss", float(terms.loss.detach()))):
                totals[k] += v
        for k, v in totals.items():
            stats[k].append(v)
        for k, v in self.optimizer_step().items():
            stats[k].append(v)

    def _no_grad_logprobs(self, model: nn.Module, batch: RolloutBatch) -> torch.Tensor:
        return no_grad_rows(lambda part: sequence_logprobs(model, part, self.algo.temperature), batch,
                            self.cfg.micro_batch_size)


def _fill_invalid(rewards: RewardResult, group_size: int) -> torch.Tensor:
    """Rewards with errored/abstained samples set to their group's mean of valid ones (so they move nothing)."""
    values = rewards.values_B.view(-1, group_size)
    ok = rewards.ok_B.view(-1, group_size).float()
    mean = (values * ok).sum(1, keepdim=True) / ok.sum(1, keepdim=True).clamp(min=1.0)
    return torch.where(ok.bool(), values, mean).reshape(-1)

