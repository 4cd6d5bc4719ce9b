"""``tool_env``: a text environment that offers a tool set and scores the final answer.

Each model turn is either tool calls (in one of the configured formats) or a final answer. Calls
run through a `ToolRunner` (timeout, errors as text) and their results come back as the next
observation; the first turn whose calls all succeed earns ``call_reward``. A message with no call is the
final answer: ``answer_reward`` if it matches the row's reference ``answer`` (else, optionally, once a call
has succeeded, ``answer_format_reward`` if it has the answer's form (``answer_pattern``) and
``answer_char_reward`` times the fraction of the answer the message starts with: credit for reading the
tool's result, never for guessing), and the episode ends. A malformed call attempt is answered
with the parse error, so the model can try again.

Each step's ``info["parts"]`` splits its reward into ``call``, ``answer`` (the correct answer) and the
shaping terms ``call_format``, ``answer_format`` and ``answer_chars``: the ``multi_turn`` engine sums
them per episode and the ``env_score`` reward reports them as reward components.

Optional format shaping for models that start from scratch: when the prompt shows an example call
(``example_pattern`` extracts it), a first turn that does not make a successful call earns
``example_reward`` times the fraction of the example it starts with (`prefix_match`). It is shaping,
not the task: it says nothing about the answer.
"""

from __future__ import annotations

import os
import re
import time
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator

from toolbox.agents.env import TEXT_ENVS, EnvStep
from toolbox.agents.parsing import CallFormat, parse_tool_calls
from toolbox.agents.tools import TOOLS, ToolCall, ToolRunner
from toolbox.core.registry import Spec, SpecOf
from toolbox.tracing.episodes import ChatRole, ToolCallRecord

TOOL = SpecOf(TOOLS)


class ToolEnvConfig(BaseModel):
    """Options of ``tool_env``."""

    model_config = ConfigDict(extra="forbid")
    tools: list[Annotated[SerializeAsAny[Spec], TOOL]] = Field(
        default_factory=lambda: [TOOL.parse({"name": "add"})], min_length=1,
        description="Tools offered, each `name` (a registered tool) and its options.")
    formats: list[CallFormat] = Field(["tool_call", "json"], min_length=1, description="Call formats recognised, "
                                      "tried in order: `tool_call` (<tool_call>{json}</tool_call>), `json` (the "
                                      "message is a call object or list), `pythonic` ([add(a=1, b=2)]).")
    timeout_s: float = Field(5.0, gt=0, description="Longest one tool call may run; a late call is an error "
                             "message to the model.")
    observation_template: str = Field("<tool_response>{result}</tool_response>", description="How one call's result "
                                      "is shown to the model; `{result}` is replaced by the result text.")
    error_template: str = Field("error: {error}", description="How a failed call or a call that does not parse is "
                                "shown (inside `observation_template`); `{error}` is replaced by the message. A char "
                                "model whose alphabet cannot spell the messages shows a fixed text instead.")
    call_reward: float = Field(0.0, description="Reward of the first turn whose tool calls all ran without error "
                               "(once per episode, so repeating a call earns nothing).")
    answer_reward: float = Field(1.0, description="Reward of a final answer equal to the row's reference answer.")
    answer_char_reward: float = Field(0.0, ge=0, description="Answer shaping: a final answer that is not right, "
                                      "given after a successful call, earns this times the fraction of the "
                                      "reference answer it starts with.")
    answer_format_reward: float = Field(0.0, ge=0, description="Answer shaping: a final answer that is not right, "
                                        "given after a successful call, earns this if it fully matches "
                                        "`answer_pattern` (a number where a number is asked for).")
    answer_pattern: str = Field(r"(?s)\s*(.*?)\s*", description="Regular expression the final message must fully "
                                "match; its group 1 is the answer compared with the reference.")
    variables_pattern: str = Field("", description="Regular expression found in the prompt as often as it "
                                   "occurs; groups 1 and 2 are a variable's name and integer value, which "
                                   "pythonic calls may pass by name (empty: no variables).")
    injected: list[str] = Field([], description="Variables passed to every call as the arguments of those names "
                                "(the model does not write them, like LangChain's injected tool arguments); "
                                "a call's own arguments come on top.")
    example_pattern: str = Field("", description="Regular expression whose group 1 extracts an example call from "
                                 "the prompt (empty: no format shaping).")
    example_reward: float = Field(0.0, ge=0, description="Format shaping: a first turn without a successful call "
                                  "earns this times the fraction of the example call it starts with.")

    @field_validator("answer_pattern", "example_pattern", "variables_pattern")
    @classmethod
    def _compiles(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"not a valid regular expression: {err}") from None
        return pattern


@TEXT_ENVS.register("tool_env", config=ToolEnvConfig)
class ToolEnv:
    """Offers tools; each turn is tool calls (answered with their results) or the final answer (scored)."""

    def __init__(self, config: ToolEnvConfig) -> None:
        self.config = config
        self.runner = ToolRunner([TOOLS.build(spec) for spec in config.tools], config.timeout_s)
        self.answer, self.example, self.turn, self.called = "", "", 0, False
        self.variables: dict[str, int] = {}

    def reset(self, prompt: str, extras: dict[str, Any]) -> str:
        self.answer, self.turn, self.called = str(extras.get("answer", "")), 0, False
        found = re.search(self.config.example_pattern, prompt) if self.config.example_pattern else None
        self.example = found.group(1) if found else ""
        pattern = self.config.variables_pattern
        self.variables = {m.group(1): int(m.group(2)) for m in re.finditer(pattern, prompt)} if pattern else {}
        return ""

    def step(self, action: str) -> EnvStep:
        self.turn += 1
        parsed = parse_tool_calls(action, self.config.formats, self.variables)
        if parsed.error:
            return _step(self._show(self._error(f"could not parse the tool call: {parsed.error}")), False,
                         {"call_format": self._shaping(action)}, role="tool", tool_calls=0, tool_errors=1)
        if parsed.calls:
            records = [self._run(call) for call in parsed.calls]
            ok = all(r.ok for r in records)
            parts = {"call": self._call_reward()} if ok else {"call_format": self._shaping(action)}
            shown = "".join(self._show(r.result if r.ok else self._error(r.result)) for r in records)
            return _step(shown, False, parts, records, "tool", tool_calls=len(records),
                         tool_errors=sum(not r.ok for r in records))
        match = re.fullmatch(self.config.answer_pattern, action)
        correct = match is not None and match.group(1) == self.answer
        shaped = self.called and not correct  # answer shaping pays for reading the tool's result, not guessing
        c = self.config
        return _step("", True, {"answer": c.answer_reward if correct else 0.0,
                                "answer_format": c.answer_format_reward if shaped and match else 0.0,
                                "answer_chars": c.answer_char_reward * prefix_match(action.strip(), self.answer)
                                if shaped else 0.0,
                                "call_format": self._shaping(action)}, correct=correct)

    def _run(self, call: ToolCall) -> ToolCallRecord:
        """Run one call (with the injected arguments) and record it: tool, arguments, result, time."""
        call = self._inject(call)
        start = time.perf_counter()
        result = self.runner.run(call)
        return ToolCallRecord(tool=call.name, arguments=call.arguments, result=result.text, ok=result.ok,
                              seconds=time.perf_counter() - start)

    def _inject(self, call: ToolCall) -> ToolCall:
        """``call`` with the ``injected`` variables added as named arguments (a call without arguments gets them all)."""
        if not self.config.injected or (isinstance(call.arguments, list) and call.arguments):
            return call
        given = call.arguments if isinstance(call.arguments, dict) else {}
        injected = {k: self.variables[k] for k in self.config.injected if k in self.variables}
        return ToolCall(call.name, {**injected, **given})

    def _call_reward(self) -> float:
        first, self.called = not self.called, True
        return self.config.call_reward if first else 0.0

    def _show(self, result: str) -> str:
        return self.config.observation_template.replace("{result}", result)

    def _error(self, message: str) -> str:
        return self.config.error_template.replace("{error}", message)

    def _shaping(self, action: str) -> float:
        """Format credit for a first turn that made no successful call (0 without an example in the prompt)."""
        if self.turn != 1 or not self.example or not self.config.example_reward:
            return 0.0
        return self.config.example_reward * prefix_match(action, self.example)


PARTS = ("call", "answer", "call_format", "answer_format", "answer_chars")


def _step(observation: str, done: bool, parts: dict[str, float], calls: list[ToolCallRecord] | None = None,
          role: ChatRole = "user", **info: Any) -> EnvStep:
    """An `EnvStep` whose reward is the sum of its ``parts``, kept in ``info["parts"]`` with every name of `PARTS`."""
    return EnvStep(observation, sum(parts.values()), done, {**info, "parts": {**dict.fromkeys(PARTS, 0.0), **parts}},
                   calls or [], role)


def prefix_match(text: str, target: str) -> float:
    """The fraction of ``target`` that ``text`` starts with (its longest common prefix over ``target``'s length).

    Credit grows one right character at a time, in order, and nothing after the first wrong one counts: a char
    model that repeats a character into a later position of the target earns nothing for it (per-position credit
    made `su((((` a resting point on the way to `sum()`).
    """
    if not target:
        return 0.0
    return len(os.path.commonprefix([text, target])) / len(target)
