"""Generation engines behind one interface: transformers (CPU default), vLLM, SGLang, HTTP."""

from toolbox.engines.base import ENGINES, InferenceEngine, PromptRequest, SamplingConfig

__all__ = ["ENGINES", "InferenceEngine", "PromptRequest", "SamplingConfig"]

from toolbox.engines import hf, http, sglang, vllm  # noqa: E402,F401  (registers the built-in engines)
