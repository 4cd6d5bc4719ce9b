"""Rule-based rewards for verifiable tasks, and the weighted-sum composite."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, model_validator

from toolbox.core.registry import Spec, SpecOf
from toolbox.rewards.base import REWARDS, Composite, Reward, RewardSample, component_names, reward_value

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _answer(sample: RewardSample) -> str | None:
    answer = sample.extras.get("answer")
    return None if answer is None else str(answer)


class ExactMatchConfig(BaseModel):
    """Options of ``exact_match``."""

    model_config = ConfigDict(extra="forbid")
    strip: bool = Field(True, description="Ignore leading/trailing whitespace.")


@REWARDS.register("exact_match", config=ExactMatchConfig)
def exact_match(config: ExactMatchConfig) -> Reward:
    """1.0 when the response equals the reference answer, else 0.0; abstains without a reference."""

    def score(sample: RewardSample) -> float | None:
        answer = _answer(sample)
        if answer is None:
            return None
        response = sample.response.strip() if config.strip else sample.response
        return 1.0 if response == (answer.strip() if config.strip else answer) else 0.0

    return score


class MathConfig(BaseModel):
    """Options of ``math``."""

    model_config = ConfigDict(extra="forbid")
    which: Literal["first", "last"] = Field("first", description="Which number in the response is the answer.")
    tolerance: float = Field(1e-6, ge=0, description="Absolute tolerance of the numeric comparison.")
    marker: str | None = Field("####", description="Final-answer marker of the reference (GSM8K's `12 - 9 = 3\\n#### 3`): "
                               "a reference holding it is read after its last one. The response is not cut: its "
                               "first or last number is its answer, so an expression (`12 - 9`) is not an answer.")


@REWARDS.register("math", config=MathConfig)
def math_answer(config: MathConfig) -> Reward:
    """1.0 when the first (or last) number in the response equals the reference numerically."""

    def score(sample: RewardSample) -> float | None:
        answer = _answer(sample)
        if answer is None:
            return None
        if config.marker and config.marker in answer:
            answer = answer.rsplit(config.marker, 1)[1]
        numbers = _NUMBER.findall(sample.response)
        if not numbers:
            return 0.0
        got = numbers[0] if config.which == "first" else numbers[-1]
        return 1.0 if abs(float(got) - float(answer)) <= config.tolerance else 0.0

    return score


class WeightedSumConfig(BaseModel):
    """Options of ``weighted_sum``: a list of reward specs and their weights."""

    model_config = ConfigDict(extra="forbid")
    components: list[Annotated[SerializeAsAny[Spec], SpecOf(REWARDS)]] = Field(
        description="Rewards, each `name` and its options.", min_length=1)
    weights: list[float] = Field(description="One weight per component.")

    @model_validator(mode="after")
    def _one_weight_each(self) -> WeightedSumConfig:
        if len(self.weights) != len(self.components):
            raise ValueError(f"weighted_sum: {len(self.components)} components but {len(self.weights)} weights")
        return self


@REWARDS.register("weighted_sum", config=WeightedSumConfig)
def weighted_sum(config: WeightedSumConfig) -> Reward:
    """Sum of weighted components. Abstains only if every component abstains; an error in any is an error
    (a NaN, infinite or non-numeric component value too, named by the component's index and name)."""
    parts = [REWARDS.build(spec) for spec in config.components]

    names = component_names([spec.name for spec in config.components])

    def score(sample: RewardSample) -> float | None:
        total, scored = 0.0, False
        values: dict[str, float | None] = dict.fromkeys(names)  # each component's unweighted value, for traces
        for i, (spec, weight, part) in enumerate(zip(config.components, config.weights, parts)):
            value = part(sample)
            if value is None:
                continue
            try:
                number = reward_value(value)
            except ValueError as err:
                raise ValueError(f"weighted_sum component {i} ({spec.name}): {err}") from None
            values[names[i]] = number
            total, scored = total + weight * number, True
        return Composite(total, values) if scored else None

    return score
