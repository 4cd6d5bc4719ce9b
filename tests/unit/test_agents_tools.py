"""`toolbox.agents.parsing` and `toolbox.agents.tools`: call formats, and tool failures returned as text."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import BaseModel

from toolbox.agents.calc import TwoIntegers
from toolbox.agents.parsing import parse_tool_calls
from toolbox.agents.tools import TOOLS, Tool, ToolCall, ToolRunner


@pytest.mark.parametrize("text", [
    'Let me add. <tool_call>{"name": "add", "arguments": {"a": 37, "b": 45}}</tool_call>',
    '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 37, \\"b\\": 45}"}\n</tool_call>',  # OpenAI: a JSON string
])
def test_tool_call_tags(text: str) -> None:
    assert parse_tool_calls(text, ["tool_call"]).calls == [ToolCall("add", {"a": 37, "b": 45})]


def test_several_tagged_calls_and_a_malformed_one() -> None:
    two = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call><tool_call>{"name":"mul","arguments":{}}</tool_call>'
    assert [c.name for c in parse_tool_calls(two, ["tool_call"]).calls] == ["add", "mul"]
    broken = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', ["tool_call"])
    assert not broken.calls and broken.error.startswith("tool call 1: Expecting property name")
    unclosed = parse_tool_calls('<tool_call>{"name": "add"}', ["tool_call"])
    assert unclosed.error == "tool call 1: <tool_call> is not closed by </tool_call>"
    no_name = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>', ["tool_call"])
    assert "a call must be an object with a string 'name'" in no_name.error


def test_bare_json_calls() -> None:
    fenced = '```json\n{"name": "add", "parameters": {"a": 1, "b": 2}}\n```'  # Llama 3.1 says "parameters"
    assert parse_tool_calls(fenced, ["json"]).calls == [ToolCall("add", {"a": 1, "b": 2})]
    listed = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "mul", "arguments": {"a": 3, "b": 4}}]'
    assert [c.name for c in parse_tool_calls(listed, ["json"]).calls] == ["add", "mul"]
    for answer in ('{"answer": 3}', "{not json", "82", "[1, 2]"):  # JSON-looking answers are answers
        assert parse_tool_calls(answer, ["json"]).calls == [] and not parse_tool_calls(answer, ["json"]).error


def test_pythonic_calls() -> None:
    assert parse_tool_calls("[add(a=37, b=45)]", ["pythonic"]).calls == [ToolCall("add", {"a": 37, "b": 45})]
    assert parse_tool_calls(" add(37,45)", ["pythonic"]).calls == [ToolCall("add", [37, 45])]
    assert parse_tool_calls("82", ["pythonic"]).calls == []
    assert parse_tool_calls("1a(", ["pythonic"]).calls == []  # garbage, no SyntaxWarning noise either
    assert parse_tool_calls("add(x, 2)", ["pythonic"]).error == "add: name 'x' is not defined (variables: none)"
    assert parse_tool_calls("add(x, y)", ["pythonic"], {"x": 3, "y": 4}).calls == [ToolCall("add", [3, 4])]
    assert parse_tool_calls("add(x + 1, 2)", ["pythonic"]).error.startswith("add: arguments must be literals")
    assert parse_tool_calls("add(1, b=2)", ["pythonic"]).error == "add: pass arguments either all by position or all by name"


def test_formats_are_tried_in_order() -> None:
    text = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
    assert parse_tool_calls(text, ["tool_call"]).calls == []
    assert parse_tool_calls(text, ["tool_call", "json"]).calls == [ToolCall("add", {"a": 1, "b": 2})]


def _runner(*tools: Tool, timeout_s: float = 2.0) -> ToolRunner:
    return ToolRunner([TOOLS.build({"name": "add"}), *tools], timeout_s)


def test_runner_calls_registered_tool_by_name_or_position() -> None:
    runner = _runner()
    assert runner.run(ToolCall("add", {"a": 37, "b": 45})).text == "82"
    assert runner.run(ToolCall("add", [37, 45])).text == "82"
    schema = TOOLS.build({"name": "add"}).schema()["function"]
    assert schema["name"] == "add" and schema["parameters"]["required"] == ["a", "b"]


def test_bad_calls_come_back_as_error_text() -> None:
    runner = _runner()
    unknown = runner.run(ToolCall("sub", {"a": 1, "b": 2}))
    assert not unknown.ok and unknown.text == "unknown tool 'sub'; available: add"
    bad = runner.run(ToolCall("add", {"a": "x", "b": 2}))
    assert not bad.ok and bad.text.startswith("bad arguments for add: a: Input should be a valid integer")
    many = runner.run(ToolCall("add", [1, 2, 3]))
    assert many.text == "bad arguments for add: add takes 2 arguments (a, b), got 3"


def test_tool_exception_and_timeout_are_text_not_crashes() -> None:
    release = threading.Event()

    def boom(args: BaseModel) -> int:
        raise ZeroDivisionError("division by zero")

    def stuck(args: BaseModel) -> int:
        release.wait(5.0)
        return 0

    runner = _runner(Tool("boom", "raises", TwoIntegers, boom), Tool("stuck", "hangs", TwoIntegers, stuck),
                     timeout_s=0.05)
    failed = runner.run(ToolCall("boom", {"a": 1, "b": 2}))
    assert not failed.ok and failed.text == "boom raised ZeroDivisionError: division by zero"
    start = time.monotonic()
    late = runner.run(ToolCall("stuck", {"a": 1, "b": 2}))
    assert time.monotonic() - start < 1.0
    assert not late.ok and late.text == "stuck timed out after 0.05s"
    release.set()
    assert runner.run(ToolCall("add", [1, 2])).text == "3"  # the runner still works
