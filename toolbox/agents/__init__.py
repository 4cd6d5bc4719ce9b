"""Multi-turn agents: text environments, tools the model calls, and the rollout driver that runs episodes.

- `toolbox.agents.env`: the `TextEnv` interface (reset / step) and the ``text_env`` registry.
- `toolbox.agents.tools`: registered tools (a Python callable and a pydantic model of its arguments, whose JSON
  schema is the tool's schema) and a runner with a per-call timeout that turns every failure into text.
- `toolbox.agents.parsing`: tool calls parsed from model text (``<tool_call>`` JSON, bare JSON, pythonic).
- `toolbox.agents.tool_env`: the ``tool_env`` environment (offers tools, scores the final answer).
- `toolbox.agents.multi_turn`: the ``multi_turn`` engine, which wraps any engine and runs whole episodes.
- `toolbox.agents.calc`: the calculator tools, the ``tool_add`` task of the ``grpo_tool_calc_tiny`` recipe and
  ``tool_add_demos``, its demonstration episodes (the recipe's SFT cold start).

Plain Python, no Ray: a `RolloutWorker` holds the ``multi_turn`` engine like any other engine.
The modules are imported by the registries' home packages (engines, data), not here, to keep imports acyclic.
"""
