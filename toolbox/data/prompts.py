"""Turning a task into tokenised prompt requests, deterministically per step (so a resumed run sees the same data)."""

from __future__ import annotations

import random

from toolbox.data.tasks import Task
from toolbox.rl.batch import PromptRequest


class PromptSource:
    """Per-step prompt requests, each prompt repeated ``group_size`` times consecutively (one group)."""

    def __init__(self, task: Task, tokenizer, seed: int) -> None:  # noqa: ANN001 - transformers type
        self.task, self.tokenizer, self.seed = task, tokenizer, seed

    def step(self, step: int, num_prompts: int, group_size: int, round: int = 0) -> list[PromptRequest]:
        """Round ``r`` > 0 (dynamic sampling top-ups) draws fresh prompts with group ids from ``r * num_prompts``."""
        key = f"{self.seed}/train/{step}" + (f"/{round}" if round else "")
        problems = self.task.sample(num_prompts, random.Random(key))
        return self._requests(problems, group_size, first_group=round * num_prompts)

    def eval_set(self, num_prompts: int) -> list[PromptRequest]:
        problems = self.task.sample(num_prompts, random.Random(f"{self.seed}/eval"))
        return self._requests(problems, 1)

    def _requests(self, problems: list, group_size: int, first_group: int = 0) -> list[PromptRequest]:
        out: list[PromptRequest] = []
        for g, problem in enumerate(problems, start=first_group):
            ids = self.tokenizer(problem.prompt, add_special_tokens=True)["input_ids"]
            out.extend(PromptRequest(ids, g, {"answer": problem.answer}) for _ in range(group_size))
        return out


def split_groups(requests: list[PromptRequest], parts: int) -> list[list[PromptRequest]]:
    """``parts`` shards of whole groups (a reward worker then sees every sample of a group)."""
    groups: dict[int, list[PromptRequest]] = {}
    for r in requests:
        groups.setdefault(r.group, []).append(r)
    return [[r for g in shard for r in g] for shard in split_even(list(groups.values()), parts)]


def split_even(items: list, parts: int) -> list[list]:
    """``parts`` contiguous slices whose sizes differ by at most one."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append(items[start : start + size])
        start += size
    return out
