"""Typed records of a multi-turn episode: each message (who said it, when, how many tokens) and each tool call (the
tool, its arguments, its result).

The ``multi_turn`` engine (`toolbox.agents.multi_turn`) writes one `TurnRecord` per model turn and per environment
reply into the row's extras (``env_trace``, as plain dicts: extras travel with the batch); learner rank 0 moves them
into the recorded sample's ``outputs.turns`` (`toolbox.tracing.record`), so ``samples.jsonl`` holds the whole
conversation and `toolbox.tracing.datasets` can turn it into chat rows.

Not covered: the tokens of a turn are counted, not kept (the sample's response holds them all, in order).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ChatRole = Literal["assistant", "tool", "user"]
TRACE_KEY = "env_trace"  # the extras key the multi_turn engine writes the records under


class ToolCallRecord(BaseModel):
    """One tool call a model turn made, as the environment ran it."""

    model_config = ConfigDict(extra="forbid")
    tool: str = Field(description="The tool's name, as the model wrote it (an unknown name is a failed call).")
    arguments: dict[str, Any] | list[Any] = Field(description="The arguments it was called with, by name or by "
                                                  "position (with any injected by the environment).")
    result: str = Field(description="What the call returned, as the text the model reads (or why it failed).")
    ok: bool = Field(description="Whether the call ran without error.")
    seconds: float = Field(0.0, ge=0, description="How long the call ran.")


class TurnRecord(BaseModel):
    """One message of an episode: a model turn, or the environment's reply to one."""

    model_config = ConfigDict(extra="forbid")
    turn: int = Field(ge=1, description="The model turn the message belongs to (its reply has the same number).")
    who: Literal["model", "env"] = Field(description="Who produced it: the policy, or the environment.")
    role: ChatRole = Field(description="Its chat role: assistant for the model, tool for a reply that answers tool "
                           "calls (or a call that did not parse), user for any other reply.")
    text: str = Field(description="The message, decoded (special tokens dropped; cut where the token budget ended "
                      "the episode).")
    tokens: int = Field(ge=0, description="Its tokens in the sample's response.")
    at_s: float = Field(ge=0, description="When it started, in seconds from the start of the episode.")
    seconds: float = Field(ge=0, description="How long it took: the engine call that generated the turn (every "
                           "episode's turn in one call), or the environment's step.")
    tool_calls: list[ToolCallRecord] = Field(default_factory=list, description="Model turns: the tool calls it "
                                             "made, with their results.")
    reward: float | None = Field(None, description="Environment replies: the reward of the turn it answers.")


def chat_messages(prompt: str, turns: list[TurnRecord]) -> list[dict[str, str]]:
    """The episode as chat messages (the ``messages`` `toolbox.data.offline` reads): the prompt as the user's, then
    each turn with its role; an empty environment reply (the one that ends the episode) is left out."""
    said = [{"role": t.role, "content": t.text} for t in turns if t.who == "model" or t.text]
    return [{"role": "user", "content": prompt}, *said]


def first_divergence(a: list[dict[str, str]], b: list[dict[str, str]]) -> int | None:
    """The index of the first message where two conversations differ, if both have an assistant turn there (the
    shared part before it is a preference pair's prompt); ``None`` otherwise (equal, one a prefix of the other, or
    diverging at an environment reply)."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None or a[i]["role"] != "assistant" or b[i]["role"] != "assistant":
        return None
    return i
