"""``llm_judge``: ask a language model to grade a response, and parse its grade with a regex.

The judge is any registered engine (``hf`` on a local model, ``http`` on an OpenAI-compatible server, ...), built
once per reward worker from ``engine`` with ``model_path`` (the judge model, whose tokenizer renders the prompt).
``template`` is filled with the sample's ``prompt``, ``response`` and ``answer`` (the reference, when the task has
one); the judge's reply must match ``pattern``, whose first group is the score. A reply without a score, a score
outside [min_score, max_score], an engine error or a call past ``timeout_s`` is retried up to ``retries`` times;
after that the sample's reward is an ERROR naming the last failure, never a 0. Retries follow the one retry
policy (`toolbox.core.retry`: short jittered pauses, counted). Prompts of concurrent samples go
to the engine as one batch (`MicroBatcher`).
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import string
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from toolbox.core.registry import Spec, SpecOf
from toolbox.core.retry import RetryPolicy
from toolbox.data.encode import render_prompt
from toolbox.engines import ENGINES, InferenceEngine, SamplingConfig  # the package: registers hf, http, ...
from toolbox.models.loading import load_tokenizer
from toolbox.rewards.base import REWARDS, Reward, RewardSample
from toolbox.rewards.batching import MicroBatcher
from toolbox.rl.batch import PromptRequest

DEFAULT_TEMPLATE = ("Rate how well the response answers the question, from 0 (wrong or useless) to 10 (correct and "
                    "complete).\nQuestion: {prompt}\nResponse: {response}\nReply with one line: Score: <0-10>")
FIELDS = ("prompt", "response", "answer")
ENGINE = SpecOf(ENGINES, default="hf")


class JudgeError(RuntimeError):
    """The judge gave no usable score after every retry."""


class LLMJudgeConfig(BaseModel):
    """Options of ``llm_judge``."""

    model_config = ConfigDict(extra="forbid")
    model_path: str = Field(description="The judge model: loaded by the `hf` engine, and its tokenizer renders "
                            "the judge prompt for any engine (for `http`, the served model's tokenizer).")
    engine: Annotated[SerializeAsAny[Spec], ENGINE] = Field(
        default_factory=ENGINE.make_default, description="Engine that runs the judge: `name` (hf, http, ...) and "
        "its options.")
    template: str = Field(DEFAULT_TEMPLATE, description="The judge prompt; {prompt}, {response} and {answer} are "
                          "replaced by the sample's (write {{ and }} for literal braces).")
    pattern: str = Field(r"Score:\s*(-?\d+(?:\.\d+)?)", description="Regex searched in the reply; its first group "
                         "is the score.")
    min_score: float = Field(0.0, description="Lowest valid score; a score outside the range is a failed attempt.")
    max_score: float = Field(10.0, description="Highest valid score.")
    normalize: bool = Field(True, description="Map [min_score, max_score] to [0, 1].")
    use_chat_template: bool = Field(True, description="Render the prompt through the judge tokenizer's chat template "
                                    "(when it has one).")
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=0.0, max_new_tokens=32),
                                     description="How the judge samples (default greedy, 32 tokens).")
    retries: int = Field(2, ge=0, description="Further attempts after a failed one (error, timeout, no score).")
    timeout_s: float = Field(30.0, gt=0, description="Longest one judge call may take (a late call is a failed "
                             "attempt; keep retries x timeout within reward.run.timeout_s).")
    batch_size: int = Field(16, ge=1, description="Most judge prompts per engine call.")
    max_wait_ms: float = Field(5.0, ge=0, description="How long a batch waits for more prompts after its first.")
    seed: int = Field(0, description="Seed of the judge engine's sampling.")

    @field_validator("template")
    @classmethod
    def _fields(cls, template: str) -> str:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        except ValueError as err:
            raise ValueError(f"not a valid template: {err} (write {{{{ and }}}} for literal braces)") from None
        unknown = sorted(names - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown placeholder(s) {unknown}; allowed: {', '.join('{' + f + '}' for f in FIELDS)}")
        return template

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, pattern: str) -> str:
        try:
            groups = re.compile(pattern).groups
        except re.error as err:
            raise ValueError(f"not a valid regular expression: {err}") from None
        if groups < 1:
            raise ValueError("needs a capture group around the score, e.g. 'Score: (\\d+)'")
        return pattern

    @model_validator(mode="after")
    def _range(self) -> LLMJudgeConfig:
        if self.max_score <= self.min_score:
            raise ValueError(f"llm_judge: max_score={self.max_score} must be above min_score={self.min_score}")
        return self


class LLMJudge:
    """One judge per reward worker: an engine, the judge tokenizer, and a batcher of judge prompts."""

    def __init__(self, config: LLMJudgeConfig) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model_path)
        self.engine: InferenceEngine = ENGINES.build(
            config.engine, inject={"model_path": config.model_path, "seed": config.seed})
        self.regex = re.compile(config.pattern)
        # the one retry policy (toolbox.core.retry), short pauses: a judge call is retried within a scoring deadline
        self.retry = RetryPolicy(attempts=config.retries + 1, first_pause_s=0.1, max_pause_s=2.0,
                                 deadline_s=config.timeout_s * (config.retries + 1))
        self.batcher: MicroBatcher[str, str] = MicroBatcher(self.ask, config.batch_size, config.max_wait_ms / 1000,
                                                            "llm_judge")

    def ask(self, prompts: list[str]) -> list[str]:
        """The judge's replies to ``prompts`` (one engine call)."""
        c = self.config
        requests = [PromptRequest(render_prompt(p, self.tokenizer, c.use_chat_template), group=i)
                    for i, p in enumerate(prompts)]
        batch = self.engine.generate(requests, c.sampling)
        ids = [row[mask.bool()] for row, mask in zip(batch.response_ids_BR, batch.response_mask_BR)]
        return list(self.tokenizer.batch_decode(ids, skip_special_tokens=True))

    def parse(self, reply: str) -> float:
        """The score in ``reply``, normalised when asked; `JudgeError` when there is none or it is out of range."""
        c = self.config
        found = self.regex.search(reply)
        if found is None:
            raise JudgeError(f"no score in the judge's reply {reply[:80]!r} (pattern {c.pattern!r})")
        try:
            score = float(found.group(1))
        except ValueError:
            raise JudgeError(f"judge score {found.group(1)!r} is not a number") from None
        if not c.min_score <= score <= c.max_score:
            raise JudgeError(f"judge score {score:g} outside [{c.min_score:g}, {c.max_score:g}]")
        return (score - c.min_score) / (c.max_score - c.min_score) if c.normalize else score

    def __call__(self, sample: RewardSample) -> float:
        c = self.config
        answer = sample.extras.get("answer")
        prompt = c.template.format(prompt=sample.prompt, response=sample.response,
                                   answer="" if answer is None else str(answer))
        tries = 0

        def attempt() -> float:
            nonlocal tries
            tries += 1
            try:
                return self.parse(self.batcher.submit(prompt).result(timeout=c.timeout_s))
            except cf.TimeoutError:
                raise JudgeError(f"judge call timed out after {c.timeout_s:g}s") from None

        try:  # every failure (engine, timeout, no score: the judge samples) is worth another try
            return self.retry.call(attempt, what="llm_judge call", retryable=lambda err: True)
        except Exception as exc:
            failure = str(exc) if isinstance(exc, JudgeError) else f"{type(exc).__name__}: {exc}"
            raise JudgeError(f"llm_judge failed after {tries} attempt(s): {failure}") from None


@REWARDS.register("llm_judge", config=LLMJudgeConfig)
def llm_judge(config: LLMJudgeConfig) -> Reward:
    """A judge model's grade of each response, parsed from its reply; a judge failure is an error, never 0."""
    return LLMJudge(config)
