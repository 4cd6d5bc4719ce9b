"""`OnlineDPOLearner`: DPO on pairs picked from freshly sampled groups, on one learner rank."""

from __future__ import annotations

import torch

from toolbox.algorithms.grpo.learner import sequence_logprobs
from toolbox.algorithms.online_dpo.config import OnlineDPOConfig
from toolbox.learner.base import LearnerBase, chunks_of, no_grad_rows, rank_slice
from toolbox.learner.config import LearnerConfig
from toolbox.objectives.online_dpo import best_worst_pairs
from toolbox.objectives.preference import dpo_loss, preference_logits
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch


class OnlineDPOLearner(LearnerBase):
    """Each rank pairs the best and worst sample of each of its groups; tied groups weigh nothing.

    Every rank processes the same number of pairs (one per group), so FSDP's collectives
    stay in step whatever the number of informative pairs.
    """

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: OnlineDPOConfig, total_steps: int) -> None:
        # DPO always measures the policy against the frozen reference.
        super().__init__(model_path, dtype, cfg, total_steps, frozen_reference=True)
        self.algo = algo

    def update(self, batches: list[RolloutBatch], results: list[RewardResult],
               keep_groups: list[int] | None = None) -> dict[str, float]:
        batch, rewards = RolloutBatch.concat(batches), RewardResult.concat(results)
        rows = rank_slice(len(batch), self.rank, self.world)
        if (rows.stop - rows.start) % self.algo.group_size:
            raise ValueError(f"learner rank {self.rank}: its {rows.stop - rows.start} rows are not whole groups of "
                             f"{self.algo.group_size}; make algorithm.prompts_per_step a multiple of learner.num_workers")
        mine = batch.select(rows)
        chosen_i, rejected_i, weight = best_worst_pairs(rewards.values_B[rows], rewards.ok_B[rows], self.algo.group_size)
        chosen, rejected = mine.select(chosen_i), mine.select(rejected_i)
        pairs = self.global_sum([float(weight.sum())])[0]
        ref_c, ref_r = self._ref_seq_logps(chosen), self._ref_seq_logps(rejected)
        totals = {"dpo_loss": 0.0, "pref_accuracy": 0.0, "margin": 0.0}
        for mb in chunks_of(slice(0, len(chosen)), self.cfg.micro_batch_size):
            pc, pr = self._seq_logps(self.policy, chosen.select(mb)), self._seq_logps(self.policy, rejected.select(mb))
            a = self.algo
            losses = dpo_loss(pc, pr, ref_c[mb], ref_r[mb], a.beta, a.loss_type, a.label_smoothing)  # type: ignore[arg-type]
            w = weight[mb]
            # Normalised by the global number of informative pairs; x world because ranks' gradients are averaged.
            (losses * w).sum().mul(self.world / max(pairs, 1.0)).backward()
            h = preference_logits(pc.detach(), pr.detach(), ref_c[mb], ref_r[mb])
            totals["dpo_loss"] += float((losses.detach() * w).sum())
            totals["pref_accuracy"] += float(((h > 0).float() * w).sum())
            totals["margin"] += float((a.beta * h * w).sum())
        stats = self.optimizer_step() if pairs > 0 else {}
        summed = self.global_sum(totals.values())
        self.step += 1
        metrics = {k: v / max(pairs, 1.0) for k, v in zip(totals, summed)}
        metrics.update(stats, pairs=pairs, **rewards.metrics())
        metrics["response_len"] = float(batch.response_lengths_B.float().mean())
        return metrics

    def _seq_logps(self, model: torch.nn.Module, part: RolloutBatch) -> torch.Tensor:
        logp = sequence_logprobs(model, part, self.algo.temperature).sum(dim=1)
        if self.algo.loss_type == "ipo":  # IPO on length-averaged log-probs, as its authors do
            logp = logp / part.response_mask_BR.sum(dim=1).clamp(min=1)
        return logp

    def _ref_seq_logps(self, part: RolloutBatch) -> torch.Tensor:
        ref = self.ref
        assert ref is not None
        return no_grad_rows(lambda rows: self._seq_logps(ref, rows), part, self.cfg.micro_batch_size)
