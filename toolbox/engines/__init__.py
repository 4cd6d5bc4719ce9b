"""Generation engines behind one interface: transformers (CPU default), vLLM, SGLang, HTTP."""

# PromptRequest lives in toolbox.rl.batch; it is re-exported here for actors/rollout.py until that imports it there.
from toolbox.engines.base import ENGINES, InferenceEngine, SamplingConfig
from toolbox.rl.batch import PromptRequest

__all__ = ["ENGINES", "InferenceEngine", "PromptRequest", "SamplingConfig"]

from toolbox.agents import multi_turn  # noqa: E402,F401  (registers the multi_turn engine, tool_env, tools)
from toolbox.engines import hf, http, sglang, vllm  # noqa: E402,F401  (registers the built-in engines)
