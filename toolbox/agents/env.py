"""The text environment interface: one episode of a conversation between the model and an environment.

An episode starts from a task's prompt (and its small per-row ``extras``, such as the reference
answer). `TextEnv.reset` may add a first observation after the prompt (a system message listing
tools, a first user turn; often nothing). Then, turn by turn, the model's message goes to
`TextEnv.step`, which answers with an `EnvStep`: the text the model reads next (a tool result, a
user turn), that turn's reward, whether the episode is over, and small info for logs.

The environment only sees and returns text; tokenizing, batching the model's turns and building
the training row is the job of the ``multi_turn`` engine (`toolbox.agents.multi_turn`). One env
object runs one episode: the engine builds a fresh one per episode from the ``text_env`` registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from toolbox.core.registry import Registry
from toolbox.tracing.episodes import ChatRole, ToolCallRecord


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to one model turn. ``calls``: the tool calls the turn made, as run (for the
    episode's trace); ``role``: the chat role of ``observation`` (``tool`` when it answers calls)."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    calls: list[ToolCallRecord] = field(default_factory=list)
    role: ChatRole = "user"


class TextEnv(Protocol):
    """One episode. ``reset`` is called once, then ``step`` once per model turn until ``done``."""

    def reset(self, prompt: str, extras: dict[str, Any]) -> str:
        """Start from the task's ``prompt`` text and row ``extras``; returns text to append to the prompt ('' for none)."""
        ...

    def step(self, action: str) -> EnvStep:
        """The model's message (special tokens dropped) -> observation, reward, done, info."""
        ...


TEXT_ENVS: Registry[TextEnv] = Registry("text_env")
