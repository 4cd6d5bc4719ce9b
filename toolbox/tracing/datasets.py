"""A run's recorded samples as training data: SFT rows by rejection sampling, DPO pairs from groups.

Both read ``RUN_DIR/samples.jsonl`` (one `SampleTrace` per line) and group samples by (step, group):
the samples of one prompt at one step. Only samples whose reward scored (state ``ok``) count.

- SFT: each group's best response, if its reward is at least ``min_reward`` (rejection sampling).
- DPO: each group's best response against its worst, where their rewards differ by more than ``min_margin``.

The rows are the formats `toolbox.data.offline` reads (``{"prompt", "response"}`` and
``{"prompt", "chosen", "rejected"}``), duplicates dropped. The prompt is the text the model saw,
decoded: with a chat-template model it is already rendered, so train on it with
``algorithm.use_chat_template=false``.

Multi-turn episodes (samples with ``outputs.turns``) become chat rows: SFT ``{"messages": [...]}`` (the prompt as
the user's message, then the model's turns as assistant messages and the environment's replies as tool or user
messages, so SFT trains on the model's turns only); DPO ``{"prompt": [messages], "chosen", "rejected"}``, the
conversation the two episodes share and the first model turn where they part (a preference between the whole
trajectories has no single answer to compare; the turn where they part is what decided them). A pair that parts
at an environment reply is left out. Chat rows are rendered with the tokenizer's chat template when trained on.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from toolbox.core.errors import ConfigError
from toolbox.tracing.entries import SampleTrace
from toolbox.tracing.episodes import chat_messages, first_divergence

Row = dict[str, Any]  # strings, or chat messages for an episode


def read_samples(path: str | Path) -> list[SampleTrace]:
    """Every trace entry of a ``samples.jsonl``; a line that is not one fails naming ``file:line`` and the field."""
    out = []
    with Path(path).open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(SampleTrace.model_validate_json(line))
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "line"
                raise ConfigError(f"{path}:{number}: not a sample trace: {where}: {first['msg']}") from None
    return out


def _scored_groups(samples: list[SampleTrace]) -> list[list[SampleTrace]]:
    """Scored samples by (step, group), best reward first (ties keep their order)."""
    groups: dict[tuple[int, int], list[SampleTrace]] = defaultdict(list)
    for s in samples:
        if s.outputs.reward_state == "ok" and s.outputs.reward is not None:
            groups[(s.step, s.inputs.group)].append(s)
    return [sorted(g, key=lambda s: -(s.outputs.reward or 0.0)) for g in groups.values()]


def sft_rows(samples: list[SampleTrace], min_reward: float) -> list[Row]:
    """Rejection sampling: the best response (or episode, as chat messages) of each group whose reward is at least
    ``min_reward``."""
    rows = {}
    for group in _scored_groups(samples):
        best = group[0]
        if (best.outputs.reward or 0.0) >= min_reward and best.outputs.response.strip():
            turns = best.outputs.turns
            row: Row = {"messages": chat_messages(best.inputs.prompt, turns)} if turns else \
                {"prompt": best.inputs.prompt, "response": best.outputs.response}
            rows[json.dumps(row)] = row
    return list(rows.values())


def dpo_rows(samples: list[SampleTrace], min_margin: float = 0.0) -> list[Row]:
    """Best vs worst of each group whose rewards differ by more than ``min_margin`` (and whose texts differ); for
    episodes, at the first model turn where they part."""
    rows = {}
    for group in _scored_groups(samples):
        best, worst = group[0], group[-1]
        margin = (best.outputs.reward or 0.0) - (worst.outputs.reward or 0.0)
        row = _pair(best, worst) if margin > min_margin else None
        if row is not None:
            rows[json.dumps(row)] = row
    return list(rows.values())


def _pair(best: SampleTrace, worst: SampleTrace) -> Row | None:
    """A preference row of two samples of one prompt (``None`` where their texts do not make one)."""
    if best.outputs.turns or worst.outputs.turns:
        chosen, rejected = (chat_messages(s.inputs.prompt, s.outputs.turns) for s in (best, worst))
        at = first_divergence(chosen, rejected)
        if at is None or not chosen[at]["content"].strip() or not rejected[at]["content"].strip():
            return None
        return {"prompt": chosen[:at], "chosen": chosen[at]["content"], "rejected": rejected[at]["content"]}
    if best.outputs.response == worst.outputs.response or not best.outputs.response.strip() \
            or not worst.outputs.response.strip():
        return None
    return {"prompt": best.inputs.prompt, "chosen": best.outputs.response, "rejected": worst.outputs.response}
