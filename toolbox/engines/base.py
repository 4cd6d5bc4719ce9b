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


class Sleepable(Protocol):
    """What an engine may add to `InferenceEngine`: free its accelerator memory while a colocated learner trains.

    ``sleep()`` drops the KV cache and moves or drops the weights; ``wake()`` takes the memory back, after which
    the engine generates and loads weights again (with vLLM's level 1, the weights it had). Both are optional:
    `sleep_engine` / `wake_engine` do nothing for an engine without them (a CPU engine, an HTTP server)."""

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


def sleep_engine(engine: Any) -> None:
    """``engine.sleep()`` where the engine has one; a no-op otherwise."""
    sleep = getattr(engine, "sleep", None)
    if sleep is not None:
        sleep()


def wake_engine(engine: Any) -> None:
    """``engine.wake()`` where the engine has one; a no-op otherwise."""
    wake = getattr(engine, "wake", None)
    if wake is not None:
        wake()
