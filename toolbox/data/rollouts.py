"""Stored rollouts: groups of sampled responses with their rewards and the behaviour policy's log-probs, read from a
run's ``samples.jsonl`` or from any dataset of group rows, to train a policy on them without sampling
(``algorithm.name=offline_grpo``).

Two row formats, told apart by their keys:

- a run's ``RUN_DIR/samples.jsonl`` (`toolbox.tracing.entries.SampleTrace`, one sample per line, recorded every
  ``trainer.log_samples_every`` steps with every sample of its group): the samples of one ``(step, group)`` are one
  group, in file order;
- a group row: ``{"prompt_ids": [...]`` (or ``"prompt": "text"``, tokenised as the built-in tasks do)``,
  "responses": [[token ids], ...], "logprobs": [[per token], ...], "rewards": [value or null, ...]}``, with an
  optional ``"finish_reasons": ["stop" | "length", ...]``.

Every group becomes one record ``{"prompt_ids", "prompt", "responses", "logprobs", "rewards", "finish_reasons"}``.
A reward of null (abstained or errored) leaves its sample out of the loss, as online. Rows are checked here, with
``data.on_bad_row``'s policy and the ``file:row`` of each problem: missing behaviour log-probs, as many log-probs as
response tokens, log-probs that are not <= 0, groups of another size than ``algorithm.group_size``.

Not covered: multi-turn episodes (their environment tokens would need the loss mask the samples do not keep).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from toolbox.core.errors import ConfigError
from toolbox.data.offline import Record
from toolbox.data.rows import BadRow, RowError, bad_rows_message, read_rows, screen

FINISH_REASONS = ("stop", "length")
SAMPLE_KEYS = {"inputs", "outputs"}  # a samples.jsonl line (SampleTrace)


def load_rollout_groups(source: str, group_size: int, on_bad_row: str = "error") -> list[Record]:
    """Every group of ``source`` (a samples.jsonl or a dataset of group rows), checked; see the module docstring."""
    rows = read_rows(source)
    parsed = screen([(row, (row, value)) for row, value in rows], _parse_row, source, on_bad_row)
    groups, bad = _groups(parsed, source, group_size)
    if bad and on_bad_row == "error":
        raise ConfigError(bad_rows_message(bad, len(bad) + len(groups)))
    if not groups:
        raise ConfigError(f"{source}: no group of algorithm.group_size={group_size} samples"
                          + (f" ({len(bad)} groups of another size skipped)" if bad else ""))
    return groups


def _parse_row(numbered: tuple[int, Any]) -> tuple[int, Any, Record]:
    """``(row number, group key, record)``: a sample line's key is its ``(step, group)`` and its record holds one
    response; a group row is a group of its own (key ``("row", number)``)."""
    number, row = numbered
    if not isinstance(row, dict):
        raise RowError(f"a stored rollout row must be an object, got {type(row).__name__}")
    if row.keys() >= SAMPLE_KEYS:
        return (number, *_sample_row(row))
    return number, ("row", number), _group_row(row)


def _sample_row(row: dict[str, Any]) -> tuple[Any, Record]:
    inputs, outputs = row["inputs"], row["outputs"]
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise RowError("a sample line's 'inputs' and 'outputs' must be objects (toolbox.tracing.entries.SampleTrace)")
    if outputs.get("turns"):
        raise RowError("a multi-turn episode (outputs.turns): offline training from stored rollouts takes single "
                       "completions only")
    if not inputs.get("prompt_ids"):
        raise RowError("no prompt token ids (inputs.prompt_ids): samples recorded before token ids and behaviour "
                       "log-probs were kept cannot be trained on")
    if not outputs.get("logprobs"):
        raise RowError("no behaviour log-probs (outputs.logprobs is missing or empty): samples recorded before they "
                       "were kept cannot be importance-corrected")
    reward = outputs.get("reward") if outputs.get("reward_state", "ok") == "ok" else None
    record = _checked(inputs["prompt_ids"], inputs.get("prompt", ""), [outputs.get("response_ids")],
                      [outputs["logprobs"]], [reward], [outputs.get("finish_reason", "stop")], "outputs.")
    return (row.get("step"), inputs.get("group")), record


def _group_row(row: dict[str, Any]) -> Record:
    missing = [k for k in ("responses", "logprobs", "rewards") if k not in row]
    if "logprobs" in missing:
        raise RowError("no behaviour log-probs ('logprobs': one list per response, a log-prob per token)")
    if missing or not ("prompt_ids" in row or "prompt" in row):
        raise RowError(f"a group row needs 'prompt' or 'prompt_ids', 'responses', 'logprobs' and 'rewards'; "
                       f"missing {missing or ['prompt']}")
    responses, logprobs, rewards = row["responses"], row["logprobs"], row["rewards"]
    for key, value in (("responses", responses), ("logprobs", logprobs), ("rewards", rewards)):
        if not isinstance(value, list) or not value:
            raise RowError(f"{key!r} must be a non-empty list")
    if not len(responses) == len(logprobs) == len(rewards):
        raise RowError(f"{len(responses)} responses, {len(logprobs)} log-prob lists and {len(rewards)} rewards: "
                       "one of each per response")
    finish = row.get("finish_reasons") or ["stop"] * len(responses)
    return _checked(row.get("prompt_ids"), row.get("prompt", ""), responses, logprobs, rewards, finish, "")


def _checked(prompt_ids: Any, prompt: Any, responses: list[Any], logprobs: list[Any], rewards: list[Any],
             finish: list[Any], prefix: str) -> Record:
    """The record of one or more responses, every field's type and length checked (``prefix`` names the fields)."""
    if prompt_ids is not None and not _ints(prompt_ids, allow_empty=False):
        raise RowError(f"prompt_ids must be a non-empty list of token ids, got {prompt_ids!r:.80}")
    if prompt_ids is None and (not isinstance(prompt, str) or not prompt):
        raise RowError("'prompt' must be a non-empty string (or give 'prompt_ids')")
    for i, (ids, lps, reward, why) in enumerate(zip(responses, logprobs, rewards, finish, strict=True)):
        at = f"{prefix}response_ids" if prefix else f"responses[{i}]"
        if not _ints(ids, allow_empty=False):
            raise RowError(f"{at} must be a non-empty list of token ids (the tokens the log-probs belong to), "
                           f"got {ids!r:.80}")
        lp_at = f"{prefix}logprobs" if prefix else f"logprobs[{i}]"
        if not isinstance(lps, list) or len(lps) != len(ids):
            raise RowError(f"{lp_at} has {len(lps) if isinstance(lps, list) else 'no'} log-probs for {len(ids)} "
                           "response tokens: one behaviour log-prob per token")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) and x <= 0 and math.isfinite(x)
                   for x in lps):
            raise RowError(f"{lp_at} must hold finite log-probs <= 0 (log p, not p), got {lps!r:.80}")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise RowError(f"{prefix}reward{'' if prefix else f's[{i}]'} must be a number or null, got {reward!r}")
        if why not in FINISH_REASONS:
            raise RowError(f"finish reason {why!r} is not one of {list(FINISH_REASONS)}")
    return {"prompt_ids": prompt_ids, "prompt": prompt, "responses": responses, "logprobs": logprobs,
            "rewards": [None if r is None else float(r) for r in rewards], "finish_reasons": list(finish)}


def _ints(value: Any, allow_empty: bool) -> bool:
    return (isinstance(value, list) and (allow_empty or bool(value))
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value))


def _groups(parsed: Sequence[tuple[int, Any, Record]], source: str,
            group_size: int) -> tuple[list[Record], list[BadRow]]:
    """Sample lines merged by group key (in file order), group rows as they are; groups of another size than
    ``group_size`` are bad, named by the rows they came from."""
    merged: dict[Any, list[tuple[int, Record]]] = {}
    for number, key, record in parsed:
        merged.setdefault(key, []).append((number, record))
    groups, bad = [], []
    for key, parts in merged.items():
        rows = [number for number, _ in parts]
        where = f"{source}:{rows[0]}" + (f"-{rows[-1]}" if len(rows) > 1 else "")
        group = _merge([record for _, record in parts], key, where)
        size = len(group["responses"])
        if size != group_size:
            what = "the group row" if key[0] == "row" else f"step {key[0]}, group {key[1]}"
            bad.append(BadRow(where, f"{what} has {size} samples; algorithm.group_size is {group_size} (advantages "
                              "are taken over whole groups)"))
        else:
            groups.append(group)
    return groups, bad


def _merge(parts: list[Record], key: Any, where: str) -> Record:
    """One group record of the sample records of one group key."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if any(p["prompt_ids"] != first["prompt_ids"] for p in parts):
        raise ConfigError(f"{where}: the samples of step {key[0]}, group {key[1]} have different prompt_ids; a "
                          "group's samples share one prompt")
    return {"prompt_ids": first["prompt_ids"], "prompt": first["prompt"],
            **{k: [x for p in parts for x in p[k]] for k in ("responses", "logprobs", "rewards", "finish_reasons")}}

