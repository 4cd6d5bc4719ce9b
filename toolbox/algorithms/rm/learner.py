"""`RMLearner`: a reward model trained on one rank with the Bradley-Terry loss on preference pairs.

The model is the base causal LM with a scalar head (`load_reward_model`: transformers'
``AutoModelForSequenceClassification``, num_labels=1; the head's init is seeded, so ranks agree). Pairs are
encoded, batched and normalised exactly as offline DPO does (a micro-batch of ``m`` pairs is one forward of
``2m`` rows, losses divided by the global pair count), so the learner reuses `DPOLearner`'s accumulation and
replaces only the per-pair terms: scores instead of log-prob ratios, and no reference model.
"""

from __future__ import annotations

from typing import Any

import torch

from toolbox.algorithms.dpo.learner import DPOLearner
from toolbox.algorithms.rm.config import RMConfig
from toolbox.data.packing import TokenBatch
from toolbox.learner.config import LearnerConfig
from toolbox.learner.offline import OfflineLearner
from toolbox.models.reward_head import load_reward_model, sequence_scores
from toolbox.objectives.reward_model import bradley_terry_loss


class RMLearner(DPOLearner):
    """One reward-model learner rank: the model with its score head, no reference."""

    load_model = staticmethod(load_reward_model)

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: RMConfig, total_steps: int,
                 task: dict[str, Any], seed: int = 0) -> None:
        OfflineLearner.__init__(self, model_path, dtype, cfg, algo, total_steps, task, seed,  # no frozen reference
                                router_loss_coef=algo.moe_aux_loss_coef)
        self.algo = algo  # type: ignore[assignment]  # what DPOLearner.encode reads: max_length, chat template
        self.rm = algo

    def _pair_terms(self, batch: TokenBatch, m: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-pair Bradley-Terry losses of a ``2m``-row batch (chosen rows first) and the detached metrics."""
        scores = sequence_scores(self.policy.model, batch)
        chosen, rejected = scores[:m], scores[m:]
        loss = bradley_terry_loss(chosen, rejected, self.rm.center_rewards_coef)
        c, r = chosen.detach(), rejected.detach()
        return loss, {"accuracy": (c > r).float(), "margin": c - r, "chosen_score": c, "rejected_score": r}
