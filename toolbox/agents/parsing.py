"""Tool calls parsed from model text, in the formats models are trained on.

- ``tool_call``: Hermes / Qwen style, one or more ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
- ``json``: the whole message is a JSON call object, or a list of them (Llama 3.1 style; ``parameters`` is
  accepted for ``arguments``), optionally inside a Markdown code fence.
- ``pythonic``: the whole message is a call or a list of calls in Python syntax, ``[add(a=1, b=2)]``
  (Llama 3.2 / 4 style). Read with `ast`, never evaluated: an argument is a literal or the name of a
  variable the environment defined (code-as-action style, ``add(x, y)`` with ``x``, ``y`` given in the
  prompt). Positional arguments map onto the tool's schema fields in order (``add(1, 2)``).

`parse_tool_calls` returns the calls found, or a `ParseResult` with an ``error`` when the text clearly
tries a call (an opened ``<tool_call>`` tag) but it does not parse; the caller returns that error to the
model as text. Text with no call at all is a final answer.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from toolbox.agents.tools import ToolCall

CallFormat = Literal["tool_call", "json", "pythonic"]
_TAGGED = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


@dataclass(frozen=True)
class ParseResult:
    """The calls found in one message (empty: a final answer), or why an attempted call did not parse."""

    calls: list[ToolCall] = field(default_factory=list)
    error: str = ""


def parse_tool_calls(text: str, formats: list[CallFormat], variables: Mapping[str, Any] | None = None) -> ParseResult:
    """Try ``formats`` in order; the first that finds a call (or a malformed attempt) decides.

    ``variables`` are the names a pythonic call may pass as arguments.
    """
    for fmt in formats:
        result = _pythonic(text, variables or {}) if fmt == "pythonic" else _PARSERS[fmt](text)
        if result.calls or result.error:
            return result
    return ParseResult()


def _tagged(text: str) -> ParseResult:
    calls = []
    for i, match in enumerate(_TAGGED.finditer(text)):
        body, closed = match.group(1).strip(), bool(match.group(2))
        if not closed:
            return ParseResult(error=f"tool call {i + 1}: <tool_call> is not closed by </tool_call>")
        try:
            calls.append(_from_object(json.loads(body)))
        except (json.JSONDecodeError, ValueError) as err:
            return ParseResult(error=f"tool call {i + 1}: {err}")
    return ParseResult(calls)


def _json(text: str) -> ParseResult:
    body = text.strip()
    fenced = _FENCE.match(body)
    body = fenced.group(1) if fenced else body
    if not body.startswith(("{", "[")):
        return ParseResult()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return ParseResult()  # JSON-looking prose is an answer, not a call
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, dict) and "name" in v for v in items):
        return ParseResult()
    try:
        return ParseResult([_from_object(v) for v in items])
    except ValueError as err:
        return ParseResult(error=str(err))


def _from_object(value: Any) -> ToolCall:
    """``{"name": str, "arguments": {...}}`` (or ``parameters``; arguments may be a JSON string, as OpenAI sends)."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ValueError(f"a call must be an object with a string 'name', got {json.dumps(value)[:80]}")
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as err:
            raise ValueError(f"{value['name']}: arguments are a string that is not JSON: {err}") from None
    if not isinstance(args, dict):
        raise ValueError(f"{value['name']}: arguments must be an object, got {type(args).__name__}")
    return ToolCall(value["name"], args)


def _pythonic(text: str, variables: Mapping[str, Any]) -> ParseResult:
    try:
        with warnings.catch_warnings():  # model text such as "1a" makes the tokenizer warn before it fails
            warnings.simplefilter("ignore", SyntaxWarning)
            node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):  # ValueError: a NUL byte in the text
        return ParseResult()
    nodes = node.elts if isinstance(node, ast.List) else [node]
    if not nodes or not all(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) for n in nodes):
        return ParseResult()
    try:
        return ParseResult([_call_of(n, variables) for n in nodes if isinstance(n, ast.Call)])
    except ValueError as err:
        return ParseResult(error=str(err))


def _call_of(node: ast.Call, variables: Mapping[str, Any]) -> ToolCall:
    assert isinstance(node.func, ast.Name)
    name = node.func.id

    def value(arg: ast.expr) -> Any:
        if isinstance(arg, ast.Name):
            if arg.id not in variables:
                defined = ", ".join(sorted(variables)) or "none"
                raise ValueError(f"{name}: name {arg.id!r} is not defined (variables: {defined})")
            return variables[arg.id]
        try:
            return ast.literal_eval(arg)
        except ValueError:
            raise ValueError(f"{name}: arguments must be literals (numbers, strings, lists, dicts) or "
                             "variable names") from None

    positional = [value(a) for a in node.args]
    named = {k.arg: value(k.value) for k in node.keywords if k.arg is not None}
    if positional and named:
        raise ValueError(f"{name}: pass arguments either all by position or all by name")
    return ToolCall(name, positional if positional else named)


_PARSERS = {"tool_call": _tagged, "json": _json}
