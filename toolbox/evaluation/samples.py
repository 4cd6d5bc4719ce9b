"""What an evaluation samples and what it keeps: eval-split requests in, one `PromptResult` per prompt out.

A dataset task (a `PromptDataset`) is evaluated on its whole held-out split, or on its first
``count`` problems; a generated toy task has no split, so ``count`` held-out problems are
drawn from the evaluation seed. Both come from `PromptSource.eval_set`, as evaluation during
training does, so prompts are rendered (chat template, system prompt) exactly as in training.
"""

from __future__ import annotations

from typing import Any

from toolbox.data.prompts import PromptSource
from toolbox.evaluation.metrics import PromptResult, status_name
from toolbox.rewards.base import RewardResult, RewardStatus
from toolbox.rewards.runner import decode_samples
from toolbox.rl.batch import PromptRequest, RolloutBatch


def eval_requests(source: PromptSource, count: int, samples: int, generated: int) -> list[PromptRequest]:
    """Each eval prompt repeated ``samples`` times consecutively (one group per prompt, numbered in split order).

    ``count`` prompts (0: the whole split); a task without a split draws ``count or generated`` held-out problems.
    """
    if source.dataset is not None:
        count = count or len(source.dataset.eval_problems())
    prompts = source.eval_set(count or generated)
    if not prompts:
        raise ValueError(f"the eval split of task {type(source.task).__name__} is empty")
    return [request for request in prompts for _ in range(samples)]


def collect(batches: list[RolloutBatch], rewards: list[RewardResult], tokenizer: Any) -> list[PromptResult]:
    """Group every scored sample by its prompt (the batch's ``group_B``), in prompt order."""
    by_group: dict[int, PromptResult] = {}
    for batch, reward in zip(batches, rewards, strict=True):
        texts = decode_samples(batch, tokenizer)
        lengths = batch.response_lengths_B.tolist()
        for i, group in enumerate(batch.group_B.tolist()):
            result = by_group.setdefault(group, PromptResult(texts[i].prompt, texts[i].extras.get("answer"),
                                                             [], [], [], [], []))
            ok = int(reward.status_B[i]) == RewardStatus.OK
            result.responses.append(texts[i].response)
            result.rewards.append(float(reward.values_B[i]) if ok else None)
            result.status.append(status_name(int(reward.status_B[i])))
            result.reasons.append(reward.reasons[i])
            result.lengths.append(int(lengths[i]))
    return [by_group[g] for g in sorted(by_group)]
