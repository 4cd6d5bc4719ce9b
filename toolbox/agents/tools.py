"""Tools a model can call: registered Python callables whose arguments are a pydantic model (the JSON schema).

A tool is registered with `register_tool`; a config selects it by name from the ``tool`` registry
(``{name: add}``), and a plugin adds its own through the ``toolbox.plugins`` entry point like any
other component. `ToolRunner.run` executes one parsed call in a worker thread with a timeout and
**always returns text**: an unknown tool, arguments that do not validate, an exception or a timeout
become a failed `ToolResult` whose message the model reads in its next turn, never a crashed rollout.

Not a sandbox: a tool runs in the rollout worker's process, and a thread cannot be killed, so a tool
stuck past its timeout keeps its thread (the shared pool has 16 of them) until it returns.
Tools that run untrusted code need a process or container sandbox of their own.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from toolbox.core.registry import Registry


@dataclass(frozen=True)
class Tool:
    """One callable tool: ``fn(args)`` takes a validated ``args`` model and returns something printable."""

    name: str
    description: str
    args: type[BaseModel]
    fn: Callable[[Any], Any]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema (what a chat template renders into the system prompt)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.args.model_json_schema()}}

    def bind(self, arguments: dict[str, Any] | list[Any]) -> BaseModel:
        """Validate ``arguments``: a mapping by name, or a list mapped onto the schema's fields in order."""
        if isinstance(arguments, list):
            names = list(self.args.model_fields)
            if len(arguments) > len(names):
                raise ValueError(f"{self.name} takes {len(names)} arguments ({', '.join(names)}), got {len(arguments)}")
            arguments = dict(zip(names, arguments))
        return self.args.model_validate(arguments)


TOOLS: Registry[Tool] = Registry("tool")


def register_tool(name: str, args: type[BaseModel], description: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Decorator on a function of one ``args`` model: ``@register_tool("add", AddArgs, "a + b")``."""

    def deco(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def make() -> Tool:
            return Tool(name, description, args, fn)

        make.__doc__ = description
        TOOLS.register(name)(make)
        return fn

    return deco


@dataclass(frozen=True)
class ToolCall:
    """A call parsed from model text: a tool name and its arguments (by name, or positional as a list)."""

    name: str
    arguments: dict[str, Any] | list[Any]


@dataclass(frozen=True)
class ToolResult:
    """What a call returned, as the text the model reads, and whether it succeeded."""

    text: str
    ok: bool


_POOL: cf.ThreadPoolExecutor | None = None


def shared_pool() -> cf.ThreadPoolExecutor:
    """The process's tool threads, shared by every episode's runner (episodes are many and short-lived)."""
    global _POOL
    if _POOL is None:
        _POOL = cf.ThreadPoolExecutor(max_workers=16, thread_name_prefix="tool")
    return _POOL


class ToolRunner:
    """Runs calls against a fixed tool set, each bounded by ``timeout_s``; never raises for a call's failure."""

    def __init__(self, tools: list[Tool], timeout_s: float, pool: cf.ThreadPoolExecutor | None = None) -> None:
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s
        self.pool = pool or shared_pool()

    def run(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(f"unknown tool {call.name!r}; available: {', '.join(sorted(self.tools))}", False)
        try:
            args = tool.bind(call.arguments)
        except (ValidationError, ValueError) as err:
            return ToolResult(f"bad arguments for {call.name}: {_one_line(err)}", False)
        future = self.pool.submit(tool.fn, args)
        try:
            value = future.result(timeout=self.timeout_s)
        except cf.TimeoutError:
            future.cancel()
            return ToolResult(f"{call.name} timed out after {self.timeout_s:g}s", False)
        except Exception as err:  # a tool's failure is text for the model, never a crashed rollout
            return ToolResult(f"{call.name} raised {type(err).__name__}: {_one_line(err)}", False)
        return ToolResult(value if isinstance(value, str) else json.dumps(value), True)


def _one_line(err: Exception) -> str:
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in err.errors())
    return " ".join(str(err).split())
