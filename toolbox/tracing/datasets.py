"""A run's recorded samples as training data: SFT rows by rejection sampling, DPO pairs from groups.

Both read ``RUN_DIR/samples.jsonl`` (one `SampleTrace` per line) and group samples by (step, group):
the samples of one prompt at one step. Only samples whose reward scored (state ``ok``) count.

- SFT: each group's best response, if its reward is at least ``min_reward`` (rejection sampling).
- DPO: each group's best response against its worst, where their rewards differ by more than ``min_margin``.

The rows are the formats `toolbox.data.offline` reads (``{"prompt", "response"}`` and
``{"prompt", "chosen", "rejected"}``), duplicates dropped. The prompt is the text the model saw,
decoded: with a chat-template model it is already rendered, so train on it with
``algorithm.use_chat_template=false``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from pydantic import ValidationError

from toolbox.core.errors import ConfigError
from toolbox.tracing.entries import SampleTrace

Row = dict[str, str]


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
    """Rejection sampling: the best response of each group whose reward is at least ``min_reward``."""
    rows = {}
    for group in _scored_groups(samples):
        best = group[0]
        if (best.outputs.reward or 0.0) >= min_reward and best.outputs.response.strip():
            row = {"prompt": best.inputs.prompt, "response": best.outputs.response}
            rows[(row["prompt"], row["response"])] = row
    return list(rows.values())


def dpo_rows(samples: list[SampleTrace], min_margin: float = 0.0) -> list[Row]:
    """Best vs worst of each group whose rewards differ by more than ``min_margin`` (and whose texts differ)."""
    rows = {}
    for group in _scored_groups(samples):
        best, worst = group[0], group[-1]
        margin = (best.outputs.reward or 0.0) - (worst.outputs.reward or 0.0)
        if margin > min_margin and best.outputs.response != worst.outputs.response and best.outputs.response.strip() \
                and worst.outputs.response.strip():
            row = {"prompt": best.inputs.prompt, "chosen": best.outputs.response, "rejected": worst.outputs.response}
            rows[tuple(row.values())] = row
    return list(rows.values())
