"""`DPOLearner`: offline preference optimisation on one rank against a frozen reference.

A micro-batch of ``m`` pairs is one forward of ``2m`` rows (chosen rows, then
rejected rows) through the policy and, without gradients, through the reference.
Per-pair losses come from the preference loss the config selects (``algorithm.loss``,
`toolbox.objectives.registry.PREFERENCE_LOSSES`) and are summed and divided by the global number of pairs, so accumulation and data parallelism
reproduce the one-big-batch gradient.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn

from toolbox.algorithms.dpo.config import DPOConfig
from toolbox.data.encode import Example, encode_preference
from toolbox.data.offline import Record
from toolbox.data.packing import TokenBatch, pad_examples
from toolbox.learner.collective import global_sum
from toolbox.learner.config import LearnerConfig
from toolbox.learner.offline import OfflineLearner
from toolbox.learner.rows import chunks_of
from toolbox.models.logprobs import token_logprobs
from toolbox.objectives.preference import implicit_rewards
from toolbox.objectives.registry import PREFERENCE_LOSSES, PairLogps
from toolbox.objectives.supervised import shift_targets


def sequence_logps(model: nn.Module, batch: TokenBatch, average: bool = False) -> torch.Tensor:
    """Summed (or, with ``average``, mean) log-prob of each row's target tokens, ``[B]``."""
    logits_BTV = model(**batch.model_inputs()).logits[:, :-1]
    labels_BT, mask_BT = shift_targets(batch.input_ids_BT, batch.loss_mask_BT, batch.doc_ids_BT)
    mask = mask_BT.to(torch.float32)
    total_B = (token_logprobs(logits_BTV, labels_BT) * mask).sum(dim=-1)
    return total_B / mask.sum(dim=-1).clamp(min=1.0) if average else total_B


class DPOLearner(OfflineLearner):
    """One offline-DPO learner rank: a trainable policy and a frozen copy of it as the reference."""

    kind = "preference"

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: DPOConfig, total_steps: int,
                 task: dict[str, Any], seed: int = 0) -> None:
        super().__init__(model_path, dtype, cfg, algo, total_steps, task, seed, frozen_reference=True,
                         router_loss_coef=algo.moe_aux_loss_coef)
        self.algo = algo
        self.loss = PREFERENCE_LOSSES.build(algo.loss)

    def encode(self, records: list[Record]) -> list[tuple[Example, Example]]:
        a = self.algo
        return [encode_preference(r, self.tokenizer, a.max_length, a.use_chat_template) for r in records]

    def accumulate(self, records: list[Record], backward: bool) -> dict[str, float]:
        pairs = self.encode(records)
        share = global_sum([len(pairs)])[0] / self.world
        sums: dict[str, float] = defaultdict(float)
        parts = chunks_of(slice(0, len(pairs)), self.cfg.micro_batch_size)
        for rows in parts:
            chosen, rejected = zip(*pairs[rows])
            batch = pad_examples(list(chosen) + list(rejected), self.tokenizer.pad_token_id)
            loss, terms = self._pair_terms(batch, len(chosen))
            value = self.policy.router.add(loss.sum() / max(share, 1e-9), 1.0 / len(parts))
            if backward:
                value.backward()
            for key, per_pair in terms.items():
                sums[key] += float(per_pair.sum()) / max(share, 1e-9)
            sums["loss"] += float(value.detach())
        keys = sorted(sums)
        reduced = global_sum([*(sums[k] for k in keys), float(sum(len(c) + len(r) for c, r in pairs)),
                              2.0 * len(pairs)])
        metrics = {k: v / self.world for k, v in zip(keys, reduced)}
        metrics["train_tokens"], metrics["train_seq_len"] = reduced[-2], reduced[-2] / max(reduced[-1], 1.0)
        return {**metrics, **self.policy.router.metrics()}

    def _pair_terms(self, batch: TokenBatch, m: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Per-pair losses of a ``2m``-row batch and the detached per-pair metrics."""
        a = self.algo
        average = self.loss.length_average
        logps = sequence_logps(self.policy.model, batch, average)
        assert self.policy.ref is not None
        with torch.no_grad():
            ref_logps = sequence_logps(self.policy.ref, batch, average)
        pc, pr, rc, rr = logps[:m], logps[m:], ref_logps[:m], ref_logps[m:]
        loss = self.loss(PairLogps(pc, pr, rc, rr), a.beta)
        chosen_r, rejected_r = implicit_rewards(pc.detach(), rc, a.beta), implicit_rewards(pr.detach(), rr, a.beta)
        terms = {"accuracy": (chosen_r > rejected_r).float(), "margin": chosen_r - rejected_r,
                 "chosen_reward": chosen_r, "rejected_reward": rejected_r,
                 "chosen_logp": pc.detach(), "rejected_logp": pr.detach()}
        return loss, terms
