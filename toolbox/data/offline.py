"""Offline datasets (SFT and preference records): any source `toolbox.data.rows` reads, or records generated from a task.

A record is normalised to one of a few plain dict shapes, whatever format the source used:

- SFT: ``{"prompt", "response"}`` strings (from ``prompt``/``response`` or ``prompt``/``completion``), or
  ``{"messages": [{role, content}, ...]}`` (from ``messages``, or ``prompt``/``completion`` given as
  message lists);
- preference: ``{"prompt", "chosen", "rejected"}`` strings, or ``{"messages", "chosen", "rejected"}``
  where ``messages`` is the shared conversation before the answer (from ``chosen``/``rejected`` given
  as message lists, with or without a ``prompt``).

`RecordSource.step` picks a step's records deterministically from ``(seed, step)``, so every learner
rank builds the same global batch on its own and a resumed run sees the same data; the driver never
holds it. Malformed rows follow ``data.on_bad_row`` (see `toolbox.data.rows.screen`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from toolbox.core.errors import ConfigError
from toolbox.data.order import EpochOrder
from toolbox.data.rows import (
    MAX_LISTED,
    DataConfig,
    RowError,
    is_local,
    local_path,
    read_rows,
    screen,
    text_field,
)
from toolbox.data.tasks import Problem, Task

Kind = Literal["sft", "preference"]
Record = dict[str, Any]
Messages = list[dict[str, str]]
ROLES = ("system", "user", "assistant", "tool")
log = logging.getLogger(__name__)


class OfflineDataConfig(BaseModel):
    """Where an offline trainer's examples come from and how they are batched and cut."""

    model_config = ConfigDict(extra="forbid")
    dataset: str = Field("", description="Training records: a .jsonl/.json/.parquet/.csv file, a save_to_disk "
                         "directory or a hub id (split 'train'); empty: generate them from the experiment's task.")
    eval_dataset: str = Field("", description="Held-out records, from the same kinds of source; empty: held-out task "
                              "samples (none for a dataset).")
    eval_samples: int = Field(64, ge=1, description="Held-out records per evaluation.")
    batch_size: int = Field(32, ge=1, description="Records per optimizer step, over all learner ranks (the global batch).")
    max_length: int = Field(64, ge=4, description="Longest tokenised sequence (longer ones are cut at the end); also the packed row length.")
    use_chat_template: bool = Field(True, description="Render prompts with the tokenizer's chat template when it has one.")
    record_kind: ClassVar[Kind] = "sft"
    # Set from the experiment's `data` section when the whole config is checked (see `check_offline_data`);
    # private, so it travels with this section to the learner ranks without being a field of it.
    _data: DataConfig = PrivateAttr(default_factory=DataConfig)

    @model_validator(mode="after")
    def _resolve_paths(self) -> OfflineDataConfig:
        """Local paths become absolute (ranks may run elsewhere); rows are checked with the whole config."""
        for field in ("dataset", "eval_dataset"):
            value = getattr(self, field)
            if value and is_local(value):  # a shipped recipe's ./configs/data/... resolves from anywhere
                setattr(self, field, str(local_path(value)))
        return self

    @property
    def data(self) -> DataConfig:
        """The experiment's `data` section (bad-row policy), as the config check handed it over."""
        return self._data

    def check_rows(self, data: DataConfig, tokenizer: Any = None) -> None:
        """Read every dataset now with ``data``'s policy, so a bad row fails before any actor starts.

        With the model's ``tokenizer`` (the driver has it once the model is resolved) each record is also
        tokenised: unknown characters, pairs identical once cut and prompts that fill ``max_length`` are bad
        rows, listed with the others in one error, and the rows cut to ``max_length`` are counted.
        """
        self._data = data
        fits = None if tokenizer is None else self.fits(tokenizer)
        for field in ("dataset", "eval_dataset"):
            value = getattr(self, field)
            if value:
                try:
                    load_records(value, self.record_kind, data.on_bad_row, fits, data.on_overflow)
                except ConfigError as err:
                    raise ConfigError(f"algorithm.{field}: {err}") from None

    def fits(self, tokenizer: Any) -> Callable[[Record], str]:
        """The tokenised check of one record (`toolbox.data.encode.check_fits`) with this section's settings."""
        from toolbox.data.encode import check_fits

        return partial(check_fits, kind=self.record_kind, tokenizer=tokenizer, max_length=self.max_length,
                       use_chat_template=self.use_chat_template)

    def check_batch(self, num_workers: int, micro_batch_size: int, unit: str, strict_micro: bool = True) -> None:
        """Batch arithmetic, checked before any actor starts."""
        per_rank, rem = divmod(self.batch_size, num_workers)
        if rem:
            raise ConfigError(f"batch arithmetic: algorithm.batch_size={self.batch_size} {unit} do not split over "
                              f"learner.num_workers={num_workers} ranks")
        if strict_micro and per_rank % micro_batch_size:
            raise ConfigError(f"batch arithmetic: each learner rank gets {per_rank} {unit} per step, which is not a "
                              f"multiple of learner.micro_batch_size={micro_batch_size}")


def messages_field(value: Any, key: str) -> Messages:
    """A non-empty list of ``{role, content}`` (extra keys dropped), or a `RowError` naming the bad turn."""
    if not isinstance(value, list) or not value:
        raise RowError(f"field {key!r} must be a non-empty list of {{role, content}}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise RowError(f"{key}[{i}] must be {{role: one of {list(ROLES)}, content: string}}, got {m!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _as_messages(value: Any, key: str, role: str) -> Messages:
    """A string field as one turn of ``role``, or a message-list field as it is."""
    if isinstance(value, str):
        return [{"role": role, "content": text_field({key: value}, key)}]
    return messages_field(value, key)


def _sft_record(row: Any) -> Record:
    if isinstance(row, dict) and "text" in row and not {"prompt", "response", "completion", "messages"} & row.keys():
        # A raw-text document: next-token pretraining on all of it (EOS, not a newline, ends it).
        return {"text": text_field(row, "text").strip("\n")}
    text_or_list = isinstance(row, dict) and any(isinstance(row.get(k), list) for k in ("prompt", "completion"))
    if isinstance(row, dict) and "messages" in row:
        messages = messages_field(row["messages"], "messages")
    elif text_or_list:
        messages = _as_messages(row.get("prompt"), "prompt", "user") + _as_messages(row.get("completion"), "completion",
                                                                                     "assistant")
    else:
        answer = "completion" if isinstance(row, dict) and "completion" in row else "response"
        return {"prompt": text_field(row, "prompt"), "response": text_field(row, answer)}
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise RowError("messages has no 'assistant' turn with content, so nothing to learn")
    return {"messages": messages}


def _split_answer(messages: Messages, key: str) -> tuple[Messages, str]:
    """(the turns before, the content of the final assistant turn) of a conversation."""
    if messages[-1]["role"] != "assistant" or not messages[-1]["content"].strip():
        raise RowError(f"{key} must end with a non-empty 'assistant' turn")
    return messages[:-1], messages[-1]["content"]


def _preference_record(row: Any) -> Record:
    if not isinstance(row, dict) or not any(isinstance(row.get(k), list) for k in ("prompt", "chosen", "rejected")):
        return {key: text_field(row, key) for key in ("prompt", "chosen", "rejected")}
    prompt = _as_messages(row["prompt"], "prompt", "user") if "prompt" in row else []
    chosen_before, chosen = _split_answer(prompt + _as_messages(row.get("chosen"), "chosen", "assistant"), "chosen")
    rejected_before, rejected = _split_answer(prompt + _as_messages(row.get("rejected"), "rejected", "assistant"),
                                              "rejected")
    if chosen_before != rejected_before:
        raise RowError("chosen and rejected must share the conversation before their final answer")
    if not chosen_before:
        raise RowError("no prompt: give 'prompt', or chosen/rejected conversations that start with it")
    return {"messages": chosen_before, "chosen": chosen, "rejected": rejected}


def normalize_record(row: Any, kind: Kind) -> Record:
    """One row of any supported format as a normalised record (see the module docstring), or a `RowError`."""
    if "messages" in (row if isinstance(row, dict) else {}) and kind == "preference":
        raise RowError("a preference record needs 'chosen' and 'rejected', not 'messages'")
    return _preference_record(row) if kind == "preference" else _sft_record(row)


def load_records(path: str | Path, kind: Kind, on_bad_row: str = "error",
                 fits: Callable[[Record], str] | None = None, on_overflow: str = "warn") -> list[Record]:
    """Every record of ``path`` (split 'train'), normalised and checked; bad rows named ``file:row`` follow ``on_bad_row``.

    ``fits`` (given where a tokenizer is at hand) raises `RowError` for a record that does not fit the model
    (see `toolbox.data.encode.check_fits`) and says why a record will be cut to ``max_length``: with
    ``on_overflow="error"`` that is a bad row too, else the cut rows are counted and logged once, here.
    """
    source = str(path)
    cut: list[int] = []

    def check(numbered: tuple[int, Any]) -> Record:
        row, value = numbered
        record = normalize_record(value, kind)
        overflow = fits(record) if fits is not None else ""
        if overflow and on_overflow == "error":
            raise RowError(f"{overflow} (data.on_overflow=error; 'warn' cuts it)")
        if overflow:
            cut.append(row)
        return record

    records = screen([(row, (row, value)) for row, value in read_rows(source)], check, source, on_bad_row)
    if cut:
        rows = ", ".join(map(str, cut[:MAX_LISTED])) + (", ..." if len(cut) > MAX_LISTED else "")
        log.warning("data: %d of %d records of %s are longer than algorithm.max_length and are cut at the end "
                    "(rows %s); data.on_overflow=error refuses them", len(cut), len(records), source, rows)
    return records


def load_jsonl(path: str | Path, kind: Kind) -> list[Record]:
    """`load_records` with bad rows an error (the name of the JSONL-only days; any source works)."""
    return load_records(path, kind)


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
    """A step's records, from a dataset (epoch-shuffled) or generated from a task; deterministic per (seed, step)."""

    def __init__(self, kind: Kind, seed: int, task: Task | None = None, records: list[Record] | None = None) -> None:
        if (task is None) == (records is None):
            raise ValueError("RecordSource needs exactly one of task= or records=")
        self.kind, self.seed, self.task, self.records = kind, seed, task, records
        self._order = EpochOrder(len(records), seed) if records else None

    @classmethod
    def train(cls, cfg: OfflineDataConfig, kind: Kind, seed: int, task: Task,
              fits: Callable[[Record], str] | None = None) -> RecordSource:
        if cfg.dataset:
            return cls(kind, seed, records=load_records(cfg.dataset, kind, cfg.data.on_bad_row, fits,
                                                        cfg.data.on_overflow))
        return cls(kind, seed, task=task)

    @classmethod
    def held_out(cls, cfg: OfflineDataConfig, kind: Kind, seed: int, task: Task,
                 fits: Callable[[Record], str] | None = None) -> RecordSource | None:
        if cfg.eval_dataset:
            return cls(kind, seed, records=load_records(cfg.eval_dataset, kind, cfg.data.on_bad_row, fits,
                                                        cfg.data.on_overflow))
        return None if cfg.dataset else cls(kind, seed + 7919, task=task)

    def step(self, step: int, n: int) -> list[Record]:
        """Records ``[step * n, (step + 1) * n)`` of the stream."""
        return self._generate(f"{self.seed}/{self.kind}/{step}", n) if self.task else self._take(step * n, n)

    def first(self, n: int) -> list[Record]:
        """A fixed set of ``n`` records (evaluation): the dataset's first ``n``, or ``n`` generated ones."""
        return self._generate(f"{self.seed}/{self.kind}/eval", n) if self.task else (self.records or [])[:n]

    def _generate(self, key: str, n: int) -> list[Record]:
        assert self.task is not None
        rng = random.Random(key)
        alphabet = self.task.alphabet()
        return [task_record(p, self.kind, rng, alphabet) for p in self.task.sample(n, rng)]

    def _take(self, start: int, n: int) -> list[Record]:
        assert self.records is not None and self._order is not None
        return [self.records[i] for i in self._order.indices(start, n)]
