"""``format``: does the response have the required shape? A regex or a sequence of tags.

Meant as a shaping term beside a correctness reward in ``weighted_sum``, e.g.
``{name: weighted_sum, components: [{name: math_verify}, {name: format}], weights: [1.0, 0.2]}``.
It never abstains and needs no reference answer. It checks shape only: ``<answer>banana</answer>``
passes, and whether the content is right is the correctness reward's question.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolbox.rewards.base import REWARDS, Reward, RewardSample

DEFAULT_TAGS = ("think", "answer")
_TAG_NAME = re.compile(r"[A-Za-z][\w-]*")


class FormatConfig(BaseModel):
    """Options of ``format``. Set ``pattern`` or ``tags``; with neither, the tags are think, answer."""

    model_config = ConfigDict(extra="forbid")
    pattern: str | None = Field(None, description="A Python regular expression the response must match "
                                "(see `match`); flags go inline, e.g. `(?s)` for `.` to match newlines.")
    tags: list[str] | None = Field(None, min_length=1, description="Tag names that must appear in this order, "
                                   "each as `<tag>...</tag>` with non-empty content and only whitespace "
                                   "between them (default: think, answer).")
    match: Literal["full", "search"] = Field("full", description="`full`: the whole response (surrounding "
                                             "whitespace ignored) must match; `search`: a match anywhere will do.")
    score_match: float = Field(1.0, description="Reward when the response has the format.")
    score_mismatch: float = Field(0.0, description="Reward when it does not.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"not a valid regular expression: {err}") from None
        return pattern

    @field_validator("tags")
    @classmethod
    def _tag_names(cls, tags: list[str] | None) -> list[str] | None:
        for tag in tags or []:
            if not _TAG_NAME.fullmatch(tag):
                raise ValueError(f"tag {tag!r} is not a tag name (a letter, then letters, digits, '_' or '-')")
        return tags

    @model_validator(mode="after")
    def _pattern_or_tags(self) -> FormatConfig:
        if self.pattern is not None and self.tags is not None:
            raise ValueError("format: set `pattern` or `tags`, not both")
        return self


def tags_pattern(tags: list[str] | tuple[str, ...]) -> str:
    """The regex of ``<a>...</a><b>...</b>``: tags in order, each with non-empty content that holds no
    tag of the same name, and only whitespace between them."""
    parts = []
    for tag in tags:
        name = re.escape(tag)
        not_a_tag = rf"(?!</?{name}>)"
        parts.append(rf"<{name}>\s*{not_a_tag}\S(?:{not_a_tag}.)*?</{name}>")
    return r"(?s)" + r"\s*".join(parts)


@REWARDS.register("format", config=FormatConfig)
def format_reward(config: FormatConfig) -> Reward:
    """``score_match`` when the response has the configured shape, else ``score_mismatch``."""
    regex = re.compile(config.pattern if config.pattern is not None else tags_pattern(config.tags or DEFAULT_TAGS))

    def score(sample: RewardSample) -> float | None:
        text = sample.response.strip() if config.match == "full" else sample.response
        found = regex.fullmatch(text) if config.match == "full" else regex.search(text)
        return config.score_match if found else config.score_mismatch

    return score
