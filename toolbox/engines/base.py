"""The `InferenceEngine` interface every generation backend implements."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from toolbox.core.registry import Registry
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.weights import WeightBucket


class SamplingConfig(BaseModel):
    """How completions are sampled."""

    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(8, ge=1, description="Longest response; longer ones finish with reason 'length'.")
    stop_at_eos: bool = Field(True, description="End a response at the tokenizer's EOS token.")


class InferenceEngine(Protocol):
    """A generation backend. Plain Python: a `RolloutWorker` actor wraps one."""

    def generate(self, requests: list[PromptRequest], sampling: SamplingConfig) -> RolloutBatch:
        """Sample one completion per request (repeat a request for several samples)."""
        ...

    def update_weights(self, buckets: list[WeightBucket]) -> int:
        """Load new policy weights; returns the bytes loaded."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The engine's current weights (for tests that compare with the learner)."""
        ...


ENGINES: Registry[InferenceEngine] = Registry("engine")
