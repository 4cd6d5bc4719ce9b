"""Offline datasets (SFT and preference records): local JSONL files or records generated from a built-in task.

A record is a plain dict: SFT records hold ``prompt`` + ``response`` strings or a
``messages`` list of ``{role, content}``; preference records hold ``prompt``,
``chosen`` and ``rejected`` strings. `RecordSource.step` picks a step's records
deterministically from ``(seed, step)``, so every learner rank builds the same global
batch on its own and a resumed run sees the same data; the driver never holds it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolbox.core.errors import ConfigError
from toolbox.data.tasks import Problem, Task

Kind = Literal["sft", "preference"]
Record = dict[str, Any]
ROLES = ("system", "user", "assistant", "tool")


class OfflineDataConfig(BaseModel):
    """Where an offline trainer's examples come from and how they are batched and cut."""

    model_config = ConfigDict(extra="forbid")
    dataset: str = Field("", description="Local JSONL file of training records; empty: generate them from the experiment's task.")
    eval_dataset: str = Field("", description="Local JSONL file of held-out records; empty: held-out task samples (none for a file dataset).")
    eval_samples: int = Field(64, ge=1, description="Held-out records per evaluation.")
    batch_size: int = Field(32, ge=1, description="Records per optimizer step, over all learner ranks (the global batch).")
    max_length: int = Field(64, ge=4, description="Longest tokenised sequence (longer ones are cut at the end); also the packed row length.")
    use_chat_template: bool = Field(True, description="Render prompts with the tokenizer's chat template when it has one.")
    record_kind: ClassVar[Kind] = "sft"

    @model_validator(mode="after")
    def _check_files(self) -> OfflineDataConfig:
        """Read every dataset file now, so a bad row fails before any actor starts; paths become absolute."""
        for field in ("dataset", "eval_dataset"):
            value = getattr(self, field)
            if value:
                path = Path(value).expanduser().resolve()
                try:
                    load_jsonl(path, self.record_kind)
                except ConfigError as err:
                    raise ConfigError(f"algorithm.{field}: {err}") from None
                setattr(self, field, str(path))
        return self

    def check_batch(self, num_workers: int, micro_batch_size: int, unit: str, strict_micro: bool = True) -> None:
        """Batch arithmetic, checked before any actor starts."""
        per_rank, rem = divmod(self.batch_size, num_workers)
        if rem:
            raise ConfigError(f"batch arithmetic: algorithm.batch_size={self.batch_size} {unit} do not split over "
                              f"learner.num_workers={num_workers} ranks")
        if strict_micro and per_rank % micro_batch_size:
            raise ConfigError(f"batch arithmetic: each learner rank gets {per_rank} {unit} per step, which is not a "
                              f"multiple of learner.micro_batch_size={micro_batch_size}")


def _fail(path: Path, row: int, what: str) -> None:
    raise ConfigError(f"{path}:{row}: {what}")


def _check_text(path: Path, row: int, rec: Record, keys: tuple[str, ...]) -> None:
    for key in keys:
        if not isinstance(rec.get(key), str):
            _fail(path, row, f"field {key!r} must be a string, got {type(rec.get(key)).__name__} (fields: {sorted(rec)})")


def _check_messages(path: Path, row: int, messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        _fail(path, row, "field 'messages' must be a non-empty list of {role, content}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            _fail(path, row, f"messages[{i}] must be {{role: one of {list(ROLES)}, content: string}}, got {m!r}")
    if not any(m["role"] == "assistant" for m in messages):
        _fail(path, row, "messages has no 'assistant' turn, so nothing to learn")


def check_record(path: Path, row: int, rec: Any, kind: Kind) -> Record:
    """Validate one record's fields; errors name ``file:row``."""
    if not isinstance(rec, dict):
        _fail(path, row, f"a record must be a JSON object, got {type(rec).__name__}")
    if kind == "preference":
        _check_text(path, row, rec, ("prompt", "chosen", "rejected"))
    elif "messages" in rec:
        _check_messages(path, row, rec["messages"])
    else:
        _check_text(path, row, rec, ("prompt", "response"))
    return rec


def load_jsonl(path: str | Path, kind: Kind) -> list[Record]:
    """Every record of a JSONL file (blank lines skipped), validated; errors name ``file:row`` (1-based line)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: dataset file not found")
    out = []
    with path.open(encoding="utf-8") as f:
        for row, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{row}: not valid JSON: {err.msg} (column {err.colno})") from None
            out.append(check_record(path, row, rec, kind))
    if not out:
        raise ConfigError(f"{path}: no records")
    return out


def wrong_answer(problem: Problem, rng: random.Random, alphabet: str) -> str:
    """A plausible wrong answer: a nearby number for numeric answers, else one character changed."""
    answer = problem.answer
    if answer.isdigit():
        return str(int(answer) + rng.choice([1, 2, 3] if int(answer) < 3 else [-2, -1, 1, 2]))
    letters = sorted({c for c in alphabet if c.isalnum()}) or sorted(set(alphabet))
    i = rng.randrange(len(answer)) if answer else 0
    choices = [c for c in letters if not answer or c != answer[i]]
    return answer[:i] + rng.choice(choices) + answer[i + 1 :]


def task_record(problem: Problem, kind: Kind, rng: random.Random, alphabet: str) -> Record:
    """An SFT record (prompt -> answer) or a preference record (chosen: the answer, rejected: a wrong one)."""
    if kind == "sft":
        return {"prompt": problem.prompt, "response": problem.answer}
    return {"prompt": problem.prompt, "chosen": problem.answer, "rejected": wrong_answer(problem, rng, alphabet)}


class RecordSource:
    """A step's records, from a file (epoch-shuffled) or generated from a task; deterministic per (seed, step)."""

    def __init__(self, kind: Kind, seed: int, task: Task | None = None, records: list[Record] | None = None) -> None:
        if (task is None) == (records is None):
            raise ValueError("RecordSource needs exactly one of task= or records=")
        self.kind, self.seed, self.task, self.records = kind, seed, task, records
        self._orders: dict[int, list[int]] = {}

    @classmethod
    def train(cls, cfg: OfflineDataConfig, kind: Kind, seed: int, task: Task) -> RecordSource:
        return cls(kind, seed, records=load_jsonl(cfg.dataset, kind)) if cfg.dataset else cls(kind, seed, task=task)

    @classmethod
    def held_out(cls, cfg: OfflineDataConfig, kind: Kind, seed: int, task: Task) -> RecordSource | None:
        if cfg.eval_dataset:
            return cls(kind, seed, records=load_jsonl(cfg.eval_dataset, kind))
        return None if cfg.dataset else cls(kind, seed + 7919, task=task)

    def step(self, step: int, n: int) -> list[Record]:
        """Records ``[step * n, (step + 1) * n)`` of the stream."""
        return self._generate(f"{self.seed}/{self.kind}/{step}", n) if self.task else self._take(step * n, n)

    def first(self, n: int) -> list[Record]:
        """A fixed set of ``n`` records (evaluation): the file's first ``n``, or ``n`` generated ones."""
        return self._generate(f"{self.seed}/{self.kind}/eval", n) if self.task else (self.records or [])[:n]

    def _generate(self, key: str, n: int) -> list[Record]:
        assert self.task is not None
        rng = random.Random(key)
        alphabet = self.task.alphabet()
        return [task_record(p, self.kind, rng, alphabet) for p in self.task.sample(n, rng)]

    def _take(self, start: int, n: int) -> list[Record]:
        assert self.records is not None
        size = len(self.records)
        return [self.records[self._order(i // size)[i % size]] for i in range(start, start + n)]

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.records or [])))
            random.Random(f"{self.seed}/epoch/{epoch}").shuffle(order)
            # A step spans at most two epochs: older orders are never needed again.
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = order
        return self._orders[epoch]
