"""Turning a task into tokenised prompt requests, deterministically per step (so a resumed run sees the same data).

A generated task (``digit_add``) samples each step's prompts from ``(seed, step)``. A finite dataset
(a `PromptDataset`, e.g. the ``dataset`` task) is read in epochs: step ``k`` of ``n`` prompts takes
stream positions ``[k * n, (k + 1) * n)`` of an order reshuffled per epoch from the seed, so a resumed
run continues with the next unseen prompt; evaluation uses the dataset's held-out prompts. Prompts
longer than the tokenizer's ``model_max_length`` (where it states a real one) are bad rows, never cut.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from toolbox.data.order import EpochOrder
from toolbox.data.tasks import Problem, PromptDataset, Task
from toolbox.rl.batch import PromptRequest

UNSTATED_LIMIT = 10**9  # transformers' stand-in for "no limit" is about 1e30
TEXT_IDS_KEPT = 1 << 16  # distinct prompt texts whose ids `PromptSource` remembers


class PromptSource:
    """Per-step prompt requests, each prompt repeated ``group_size`` times consecutively (one group)."""

    def __init__(self, task: Task, tokenizer: Any, seed: int) -> None:
        self.task, self.tokenizer, self.seed = task, tokenizer, seed
        self.text_ids: dict[str, list[int]] = {}  # a task's prompt text -> its ids (`prompt_ids`)
        self.dataset = task if isinstance(task, PromptDataset) else None
        self.order: EpochOrder | None = None
        if self.dataset is not None:
            limit = getattr(tokenizer, "model_max_length", None)
            if isinstance(limit, int) and limit < UNSTATED_LIMIT:
                self.dataset.drop_long(lambda p: len(self.prompt_ids(p)), limit)
            self.order = EpochOrder(len(self.dataset.train_problems()), seed, "prompts")

    def step(self, step: int, num_prompts: int, group_size: int, round: int = 0) -> list[PromptRequest]:
        """Round ``r`` > 0 (dynamic sampling top-ups) draws fresh prompts with group ids from ``r * num_prompts``."""
        key = f"{self.seed}/train/{step}" + (f"/{round}" if round else "")
        if self.dataset is not None and self.order is not None and round == 0:
            train = self.dataset.train_problems()
            problems: Sequence[Problem] = [train[i] for i in self.order.indices(step * num_prompts, num_prompts)]
        else:
            problems = self.task.sample(num_prompts, random.Random(key))
        return self._requests(problems, group_size, first_group=round * num_prompts)

    def eval_set(self, num_prompts: int) -> list[PromptRequest]:
        """``num_prompts`` fixed evaluation prompts: a dataset's first held-out ones, or seeded samples of a task."""
        if self.dataset is not None:
            return self._requests(self.dataset.eval_problems()[:num_prompts], 1)
        problems = self.task.sample(num_prompts, random.Random(f"{self.seed}/eval"))
        return self._requests(problems, 1)

    def prompt_ids(self, problem: Problem) -> list[int]:
        """A problem's prompt as ids: the dataset's own rendering (chat template, system prompt), else plain text
        (remembered by text: a generated task repeats its prompts, and the driver tokenises every step's)."""
        if self.dataset is not None:
            return self.dataset.prompt_ids(problem, self.tokenizer)
        ids = self.text_ids.get(problem.prompt)
        if ids is None:
            ids = list(self.tokenizer(problem.prompt, add_special_tokens=True)["input_ids"])
            if len(self.text_ids) < TEXT_IDS_KEPT:
                self.text_ids[problem.prompt] = ids
        return ids

    def _requests(self, problems: Sequence[Problem], group_size: int, first_group: int = 0) -> list[PromptRequest]:
        out: list[PromptRequest] = []
        for g, problem in enumerate(problems, start=first_group):
            ids = self.prompt_ids(problem)
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
