"""`OfflineGRPOLearner`: one learner rank of GRPO on stored rollouts.

Each rank reads the stored groups itself (`toolbox.data.rollouts`) and takes step ``k``'s ``prompts_per_step``
groups in a seeded epoch order (`EpochOrder`, so a resumed run sees the same groups), lays them out as the
`RolloutBatch` and `RewardResult` a rollout and reward worker would have returned (behaviour log-probs included),
and hands them to `GRPOLearner`: the same plan (advantages, step metrics), rows per rank and update as online. The
importance correction is the online loss's (`toolbox.objectives.policy`): ``importance=truncated`` weighs each
token by ``min(pi_old / pi_behaviour, tis_cap)``; ``importance=ratio`` makes pi_behaviour the loss's pi_old.
"""

from __future__ import annotations

from typing import Any

import torch

from toolbox.algorithms.grpo.learner import GRPOLearner
from toolbox.algorithms.offline_grpo.config import OfflineGRPOConfig
from toolbox.data.offline import Record
from toolbox.data.order import EpochOrder
from toolbox.data.rollouts import load_rollout_groups
from toolbox.learner.collective import rank
from toolbox.learner.config import LearnerConfig
from toolbox.learner.policy import PolicyRank
from toolbox.models.loading import load_tokenizer
from toolbox.rewards.base import RewardResult, RewardStatus
from toolbox.rl.batch import FINISH_LENGTH, FINISH_STOP, RolloutBatch


class OfflineGRPOLearner:
    """A GRPO learner rank fed from stored rollouts. ``update(step)`` and ``evaluate()`` are collective."""

    def __init__(self, model_path: str, dtype: str, cfg: LearnerConfig, algo: OfflineGRPOConfig, total_steps: int,
                 task: dict[str, Any] | None = None, seed: int = 0) -> None:
        """As the offline loop builds every learner (``task`` is not read: the stored rollouts are the data)."""
        self.algo = algo
        self.grpo = GRPOLearner(model_path, dtype, cfg, algo, total_steps,
                                old_from_behaviour=algo.importance == "ratio")
        self.tokenizer = load_tokenizer(model_path)
        self.groups = load_rollout_groups(algo.dataset, algo.group_size, algo.data.on_bad_row)
        self.order = EpochOrder(len(self.groups), seed)

    @property
    def policy(self) -> PolicyRank:
        return self.grpo.policy

    def update(self, step: int) -> dict[str, float]:
        """One GRPO step on step ``step``'s stored groups; returns the metrics of every rank."""
        groups = [self.groups[i] for i in self.order.indices(step * self.algo.prompts_per_step,
                                                             self.algo.prompts_per_step)]
        batch, rewards = stored_batch(groups, self.tokenizer)
        plan = self.grpo.plan([batch], [rewards])  # every rank makes the same plan from the same groups
        return self.grpo.update(plan, {i: batch for i in plan.shards_for(rank())})

    def evaluate(self) -> dict[str, float]:
        """No held-out metrics: stored rollouts score nothing new (evaluate the policy with ``toolbox eval``)."""
        return {}


def stored_batch(groups: list[Record], tokenizer: Any) -> tuple[RolloutBatch, RewardResult]:
    """Stored groups as one step's batch: left-padded prompts (a text prompt tokenised as the built-in tasks do),
    right-padded responses with their behaviour log-probs, and the rewards (a null one abstains)."""
    pad = int(tokenizer.pad_token_id)
    prompts, responses, logprobs, group, finish, rewards = [], [], [], [], [], []
    for g, record in enumerate(groups):
        prompt = record["prompt_ids"] or list(tokenizer(record["prompt"], add_special_tokens=True)["input_ids"])
        for ids, lps, reward, why in zip(record["responses"], record["logprobs"], record["rewards"],
                                         record["finish_reasons"], strict=True):
            prompts.append(prompt)
            responses.append(ids)
            logprobs.append(lps)
            group.append(g)
            finish.append(FINISH_LENGTH if why == "length" else FINISH_STOP)
            rewards.append(reward)
    prompt_ids_BP, prompt_mask_BP = _padded(prompts, pad, left=True)
    response_ids_BR, response_mask_BR = _padded(responses, pad, left=False)
    logprobs_BR = torch.zeros(response_ids_BR.shape)
    for b, lps in enumerate(logprobs):
        logprobs_BR[b, : len(lps)] = torch.tensor(lps)
    batch = RolloutBatch(prompt_ids_BP, prompt_mask_BP, response_ids_BR, response_mask_BR, logprobs_BR,
                         torch.tensor(group), torch.tensor(finish))
    ok = [r is not None for r in rewards]
    result = RewardResult(torch.tensor([r if r is not None else 0.0 for r in rewards]),
                          torch.tensor([RewardStatus.OK if o else RewardStatus.ABSTAIN for o in ok]),
                          ["" if o else "no reward stored" for o in ok])
    return batch, result


def _padded(rows: list[list[int]], pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` as ``[B, max length]`` token ids padded with ``pad`` on the left or right, and the mask of tokens."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        at = slice(width - len(row), width) if left else slice(0, len(row))
        ids[b, at], mask[b, at] = torch.tensor(row, dtype=torch.long), 1
    return ids, mask
