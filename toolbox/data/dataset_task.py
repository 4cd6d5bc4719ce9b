"""The ``dataset`` task: prompts and reference answers from a user's dataset, for GRPO / PPO / online DPO.

``task.name=dataset task.path=PATH task.prompt_field=question task.answer_field=answer`` reads
``PATH`` (a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file, a ``save_to_disk`` directory or a
hub id; see `toolbox.data.rows`). Held-out prompts for evaluation come from ``eval_split`` or a
seeded ``eval_fraction`` of the training split; with neither, evaluation reuses training prompts.

Deterministic epochs: `toolbox.data.prompts.PromptSource` reads the training prompts as a stream
shuffled per epoch from ``trainer.seed`` (`toolbox.data.order.EpochOrder`), and step ``k`` reads
positions ``[k * n, (k + 1) * n)``. The position is a function of the step, which the checkpoint
records, so step ``k`` of a resumed run is step ``k`` of a run that never stopped: it continues with
the next unseen prompt. ``sample(n, rng)`` (DAPO's extra rounds, generated SFT records) draws from
the same training prompts without consuming the stream.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolbox.core.errors import ConfigError
from toolbox.data.encode import render_prompt
from toolbox.data.rows import DataConfig, RowError, is_local, local_path, read_rows, screen, text_field
from toolbox.data.tasks import TASKS, Problem


@dataclass(frozen=True)
class SourcedProblem(Problem):
    """A problem that remembers its row (``file:row``) for messages about it."""

    where: str = ""


class DatasetTaskConfig(BaseModel):
    """Options of the ``dataset`` task."""

    model_config = ConfigDict(extra="forbid")
    path: str = Field(description="A .jsonl/.json/.parquet/.csv file, a directory written by save_to_disk, or a hub id.")
    prompt_field: str = Field("prompt", description="Column holding the prompt text.")
    answer_field: str = Field("answer", description="Column holding the reference answer the reward checks (a string "
                              "or a number).")
    split: str = Field("train", description="Split of the training prompts (a single file has only 'train').")
    eval_split: str = Field("", description="Split of the held-out evaluation prompts; empty: see eval_fraction.")
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="Fraction of `split` held out for evaluation "
                                 "(chosen by split_seed) when eval_split is empty; 0 with no eval_split: evaluation "
                                 "reuses training prompts.")
    split_seed: int = Field(0, description="Seed of the eval_fraction hold-out (fixed, so `toolbox eval` sees the same one).")
    template: str = Field("{prompt}", description="Format string around the prompt text, e.g. "
                          "'Question: {prompt}\\nAnswer:'.")
    system_prompt: str = Field("", description="System message before the prompt (a chat template renders it as a "
                               "system turn; without one it is a line before the prompt).")
    use_chat_template: bool = Field(True, description="Render prompts with the tokenizer's chat template when it has one.")

    @model_validator(mode="after")
    def _check(self) -> DatasetTaskConfig:
        if self.eval_split and self.eval_fraction:
            raise ValueError(f"give eval_split ({self.eval_split!r}) or eval_fraction ({self.eval_fraction}), not both")
        try:
            self.template.format(prompt="")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"template {self.template!r} must be a format string whose only field is "
                             f"{{prompt}} (braces doubled elsewhere): {err!r}") from None
        if "{prompt}" not in self.template:
            raise ValueError(f"template {self.template!r} has no {{prompt}} field")
        if is_local(self.path):  # absolute, so a worker started elsewhere reads the same file
            self.path = str(local_path(self.path))
        return self


@TASKS.register("dataset", config=DatasetTaskConfig)
class DatasetTask:
    """Prompts and answers read from a dataset; malformed rows follow ``data.on_bad_row``."""

    def __init__(self, config: DatasetTaskConfig, data: DataConfig | None = None) -> None:
        self.config, self.data = config, data or DataConfig()
        train = self._load(config.split)
        if config.eval_split:
            held = self._load(config.eval_split)
        elif config.eval_fraction:
            train, held = hold_out(train, config.eval_fraction, config.split_seed)
        else:
            held = train
        self._train, self._eval = train, held

    def _load(self, split: str) -> list[SourcedProblem]:
        c = self.config
        source = c.path if split == "train" else f"{c.path}[{split}]"
        # Each row's check sees its number too: a problem remembers where it came from.
        numbered = [(row, (row, value)) for row, value in read_rows(c.path, split)]
        return screen(numbered, lambda item: self._problem(item[0], item[1], source), source, self.data.on_bad_row)

    def _problem(self, row: int, value: Any, source: str) -> SourcedProblem:
        c = self.config
        prompt = text_field(value, c.prompt_field, " (set task.prompt_field)")
        answer = value.get(c.answer_field)
        if c.answer_field not in value:
            raise RowError(f"field {c.answer_field!r} is missing (set task.answer_field; fields: {sorted(value)})")
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise RowError(f"field {c.answer_field!r} must be a string or a number, got {type(answer).__name__}")
        if not str(answer).strip():
            raise RowError(f"field {c.answer_field!r} is empty")
        return SourcedProblem(c.template.format(prompt=prompt), str(answer), f"{source}:{row}")

    def train_problems(self) -> Sequence[Problem]:
        """The training prompts, in dataset order (`PromptSource` shuffles them per epoch)."""
        return self._train

    def eval_problems(self) -> Sequence[Problem]:
        """The held-out prompts (the training prompts when nothing is held out), in dataset order."""
        return self._eval

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """``n`` training prompts drawn by ``rng`` (without replacement while ``n`` allows)."""
        if n <= len(self._train):
            return list(rng.sample(self._train, n))
        return list(rng.choices(self._train, k=n))

    def alphabet(self) -> str:
        """Every character of the rendered prompts, answers and system prompt (a char tokenizer's vocabulary)."""
        texts = [p.prompt + p.answer for p in (*self._train, *self._eval)]
        return "".join(sorted(set("".join(texts) + self.config.system_prompt + "\n")))

    def prompt_ids(self, problem: Problem, tokenizer: Any) -> list[int]:
        """The ids an engine generates from: chat template (with the system prompt) when used, else plain text."""
        c = self.config
        return render_prompt(problem.prompt, tokenizer, c.use_chat_template, c.system_prompt)

    def drop_long(self, length: Callable[[Problem], int], limit: int) -> None:
        """Prompts longer than ``limit`` tokens are bad rows (never cut): an error, or skipped, per ``data.on_bad_row``."""
        def fits(problem: SourcedProblem) -> SourcedProblem:
            if (n := length(problem)) > limit:
                raise RowError(f"prompt is {n} tokens, longer than the model's limit of {limit}")
            return problem

        for name in ("_train", "_eval"):
            problems: list[SourcedProblem] = getattr(self, name)
            located = [(int(p.where.rsplit(":", 1)[1]), p) for p in problems]
            source = problems[0].where.rsplit(":", 1)[0]
            setattr(self, name, screen(located, fits, source, self.data.on_bad_row))


def hold_out(problems: list[SourcedProblem], fraction: float, seed: int) -> tuple[list[SourcedProblem], list[SourcedProblem]]:
    """(train, held-out): a seeded ``fraction`` of the rows (at least one) held out, both kept in dataset order."""
    n_held = max(1, round(len(problems) * fraction))
    if n_held >= len(problems):
        raise ConfigError(f"task.eval_fraction={fraction} holds out all {len(problems)} prompts; lower it")
    held = set(random.Random(f"{seed}/held_out").sample(range(len(problems)), n_held))
    return ([p for i, p in enumerate(problems) if i not in held], [p for i, p in enumerate(problems) if i in held])
