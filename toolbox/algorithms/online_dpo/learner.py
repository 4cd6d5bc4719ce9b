"""`OnlineDPOLearner`: DPO on pairs picked from freshly sampled groups, on one learner rank.

`plan` (rank 0, once per step) pairs the best and worst sample of every group and counts
the informative pairs; `update` (every rank) trains on the pairs of its own groups against
the frozen reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolbox.algorithms.online_dpo.config import OnlineDPOConfig
from toolbox.learner.collective import global_sum, rank, world
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.learner.rows import chunks_of, no_grad_rows
from toolbox.models.logprobs import response_logprobs
from toolbox.objectives.online_dpo import best_worst_pairs, sequence_logps
from toolbox.objectives.preference import preference_logits
from toolbox.objectives.registry import PREFERENCE_LOSSES, PairLogps
from toolbox.rewards.base import RewardResult
from toolbox.rl.batch import RolloutBatch
from toolbox.rl.plan import StepPlan, read_step


@dataclass
class OnlineDPOPlan(StepPlan):
    """Per rank, one entry per group of its rows: the chosen and rejected row (positions in the rank's rows)
    and the pair's weight (0 for a tied group). ``pairs`` is the step's number of informative pairs."""

    chosen: list[torch.Tensor]
    rejected: list[torch.Tensor]
    weight: list[torch.Tensor]
    pairs: float


class OnlineDPOLearner:
    """Each rank trains on the best/worst pair of each of its groups; tied groups weigh nothing.

    Every rank processes the same number of pairs (one per group), so FSDP's collectives
    stay in step whatever the number of informative pairs. Every public method is
    collective: all ranks call it together (`plan`: rank 0 alone).
    """

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: OnlineDPOConfig, total_steps: int) -> None:
        self.cfg, self.algo = cfg, algo
        # DPO always measures the policy against the frozen reference.
        self.policy = PolicyRank.pretrained(model_path, dtype, cfg, total_steps, frozen_reference=True,
                                            router_loss_coef=algo.moe_aux_loss_coef)
        self.loss = PREFERENCE_LOSSES.build(algo.loss)

    def plan(self, shards: list[RolloutBatch], results: list[RewardResult],
             keep_groups: list[int] | None = None) -> OnlineDPOPlan:
        """Best/worst pairs of every group of the step, dealt to the ranks whole groups at a time."""
        g = self.algo.group_size
        step = read_step(shards, results, keep_groups)
        cuts = step.shares(world(), whole=g)
        chosen, rejected, weight = best_worst_pairs(step.rewards.values_B, step.rewards.ok_B, g)
        groups = [slice(c.start // g, c.stop // g) for c in cuts]
        return OnlineDPOPlan(**step.plan_fields(shards, cuts), pairs=float(weight.sum()),
                             chosen=[chosen[s] - c.start for s, c in zip(groups, cuts)],
                             rejected=[rejected[s] - c.start for s, c in zip(groups, cuts)],
                             weight=[weight[s] for s in groups])

    def update(self, plan: OnlineDPOPlan, shards: dict[int, RolloutBatch]) -> dict[str, float]:
        """One DPO step on this rank's pairs, normalised by the step's number of informative pairs."""
        r, pairs = rank(), plan.pairs
        mine = plan.gather(r, shards)
        chosen, rejected, weight = mine.select(plan.chosen[r]), mine.select(plan.rejected[r]), plan.weight[r]
        ref_c, ref_r = self._ref_seq_logps(chosen), self._ref_seq_logps(rejected)
        totals = {"dpo_loss": 0.0, "pref_accuracy": 0.0, "margin": 0.0}
        backpropagated = 0.0
        a = self.algo
        parts = chunks_of(slice(0, len(chosen)), self.cfg.micro_batch_size)
        for mb in parts:
            pc, pr = (self._seq_logps(self.policy.model, rows.select(mb)) for rows in (chosen, rejected))
            losses = self.loss(PairLogps(pc, pr, ref_c[mb], ref_r[mb]), a.beta)
            w = weight[mb]
            # Normalised by the global number of informative pairs; x world because ranks' gradients are averaged.
            loss = self.policy.router.add((losses * w).sum().mul(world() / max(pairs, 1.0)), 1.0 / len(parts))
            loss.backward()
            backpropagated += float(loss.detach()) / world()
            h = preference_logits(pc.detach(), pr.detach(), ref_c[mb], ref_r[mb])
            totals["dpo_loss"] += float((losses.detach() * w).sum())
            totals["pref_accuracy"] += float(((h > 0).float() * w).sum())
            totals["margin"] += float((a.beta * h * w).sum())
        # With no informative pair only the router loss (when on) has a gradient: it still steps, nothing is left over.
        stats = self.policy.optimizer_step() if pairs > 0 or self.policy.router.on else {}
        *summed, loss_all = global_sum([*totals.values(), backpropagated])
        self.policy.step += 1
        metrics = {k: v / max(pairs, 1.0) for k, v in zip(totals, summed)}
        metrics["loss"] = loss_all  # what was back-propagated (DPO and router loss) averaged over ranks
        metrics.update(stats, pairs=pairs, **plan.metrics, **self.policy.router.metrics())
        return metrics

    def _seq_logps(self, model: torch.nn.Module, part: RolloutBatch) -> torch.Tensor:
        """The model's own tokens' log-probs summed (environment tokens of multi-turn rows excluded), or averaged
        when the loss says so (IPO, as its authors use it)."""
        logp_BR = response_logprobs(model, part, self.algo.temperature)
        return sequence_logps(logp_BR, part.loss_mask_BR, length_average=self.loss.length_average)

    def _ref_seq_logps(self, part: RolloutBatch) -> torch.Tensor:
        ref = self.policy.ref
        assert ref is not None
        return no_grad_rows(lambda rows: self._seq_logps(ref, rows), part, self.cfg.micro_batch_size)
