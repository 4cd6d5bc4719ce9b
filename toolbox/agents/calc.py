"""Calculator tools (``add``, ``sum``, ``mul``) and the ``tool_add`` task of the ``grpo_tool_calc_tiny`` recipe.

``tool_add`` asks for the sum of two-digit numbers, which a tiny char model cannot learn to do in
its head within minutes, and shows the call that gets it from the calculator. With ``style:
literal`` the call carries the numbers (``37+45? sum(37,45)>``); with ``style: variables`` the prompt
names them and the call passes the names (``a=37 b=45? sum(a,b)>``, code-as-action style; the
``tool_env`` binds them with ``variables_pattern``). The model learns to make the call, read the
tool's result from the environment's reply, and answer with it. Its alphabet is just the prompt's
and the call's characters (and `;`): an environment that talks to a char model built from it must
spell its replies with them (``tool_env``'s ``error_template`` replaces the tools' English errors).

``tool_add_demos`` is the same task with a demonstration episode as the answer (``sum()=82;82;``: the call,
the tool's reply, the final answer): SFT records for the recipe's cold start (`toolbox.driver.cold_start`). A char
tokenizer has no chat template to mark whose turn is whose, so the SFT loss also covers the reply's tokens;
generation never writes them (the model's turn ends at the call's ``)``), and GRPO masks them.
"""

from __future__ import annotations

import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from toolbox.agents.tools import register_tool
from toolbox.data.tasks import TASKS, Problem


class TwoIntegers(BaseModel):
    """Arguments of a binary integer operation."""

    model_config = ConfigDict(extra="forbid")
    a: int = Field(description="First operand.")
    b: int = Field(description="Second operand.")


@register_tool("add", TwoIntegers, "Add two integers: a + b.")
def add(args: TwoIntegers) -> int:
    return args.a + args.b


@register_tool("sum", TwoIntegers, "The sum of two integers: a + b (``add`` under a name with no repeated letter, "
               "which a char model spells more easily).")
def sum_(args: TwoIntegers) -> int:
    return args.a + args.b


@register_tool("mul", TwoIntegers, "Multiply two integers: a * b.")
def mul(args: TwoIntegers) -> int:
    return args.a * args.b


class ToolAddConfig(BaseModel):
    """Options of the ``tool_add`` task."""

    model_config = ConfigDict(extra="forbid")
    low: int = Field(10, ge=0, description="Smallest operand.")
    high: int = Field(49, ge=0, description="Largest operand (the default keeps every sum at two digits, so the "
                      "tool's result always has the same width).")
    style: Literal["literal", "variables", "injected"] = Field(
        "injected", description="`literal`: `37+45?`, called as `sum(37,45)`; `variables`: `a=37 b=45?`, called as "
        "`sum(a,b)`; `injected`: `a=37 b=45?`, called as `sum()` (the env injects a and b).")
    tool: Literal["add", "sum"] = Field("sum", description="The tool the shown call names. `sum` has no "
                                        "repeated letter: a char model writes `sum(` from one-character "
                                        "contexts, where `add(` needs two (after `d` comes `d`, then `(`).")
    show_call: bool = Field(True, description="End the prompt with the call that answers it (what `tool_env`'s "
                            "`example_pattern` reads for format shaping).")


@TASKS.register("tool_add", config=ToolAddConfig)
class ToolAdd:
    """``"a=37 b=45? sum(a,b)>"`` -> ``"82"``: two-digit addition meant to be solved with a calculator tool."""

    def __init__(self, config: ToolAddConfig) -> None:
        if config.high < config.low:
            raise ValueError(f"task.high ({config.high}) is below task.low ({config.low})")
        self.config = config

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return [Problem(prompt, str(a + b)) for prompt, _, a, b in self.episodes(n, rng)]

    def episodes(self, n: int, rng: random.Random) -> list[tuple[str, str, int, int]]:
        """``n`` problems as (prompt, the call that answers it, a, b)."""
        out = []
        for _ in range(n):
            a, b = rng.randint(self.config.low, self.config.high), rng.randint(self.config.low, self.config.high)
            literal = self.config.style == "literal"
            args = {"literal": f"{a},{b}", "variables": "a,b", "injected": ""}[self.config.style]
            question = f"{a}+{b}?" if literal else f"a={a} b={b}?"
            call = f"{self.config.tool}({args})"
            out.append((f"{question} {call}>" if self.config.show_call else f"{question}>", call, a, b))
        return out

    def alphabet(self) -> str:
        # The prompt and the pythonic call only: a small vocabulary is what lets a random char model find the
        # call quickly. The recipe's env shows results as `={result}>` and errors as `?`, all spelled from here.
        return "0123456789+=?>; ab(),dmsu"


class ToolAddDemosConfig(ToolAddConfig):
    """Options of the ``tool_add_demos`` task: ``tool_add``'s, and how a demonstration episode is written."""

    demonstration: str = Field("{call}={result};{result};", description="A demonstration episode (the SFT "
                               "response): `{call}` is the call that answers the prompt, `{result}` the sum. "
                               "The default matches the `grpo_tool_calc_tiny` recipe's env (reply `={result};`, "
                               "answer `{result};`).")


@TASKS.register("tool_add_demos", config=ToolAddDemosConfig)
class ToolAddDemos(ToolAdd):
    """``tool_add`` with a whole demonstration episode as the answer: ``"a=37 b=45? sum()>"`` -> ``"sum()=82;82;"``."""

    config: ToolAddDemosConfig

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        template = self.config.demonstration
        return [Problem(prompt, template.replace("{call}", call).replace("{result}", str(a + b)))
                for prompt, call, a, b in self.episodes(n, rng)]
