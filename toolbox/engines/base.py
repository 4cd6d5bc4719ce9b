"""The `InferenceEngine` interface every generation backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from toolbox.core.registry import Registry
from toolbox.rl.batch import PromptRequest, RolloutBatch
from toolbox.rl.weights import TensorSpec, WeightBucket


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


@runtime_checkable
class Sleepable(Protocol):
    """What an engine may add to `InferenceEngine`: free its accelerator memory while a colocated learner trains.

    ``sleep()`` drops the KV cache and moves or drops the weights; ``wake()`` takes the memory back, after which
    the engine generates and loads weights again (with vLLM's level 1, the weights it had). Both are optional:
    `sleep_engine` / `wake_engine` do nothing for an engine without them (a CPU engine, an HTTP server)."""

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


@runtime_checkable
class WakesInStages(Sleepable, Protocol):
    """A `Sleepable` engine that can take back its weights' memory alone (vLLM): a weight load into a sleeping engine
    then wakes the weights first and the KV cache after the load, never holding both at once needlessly."""

    def wake_weights(self) -> None: ...


@runtime_checkable
class DeviceSyncable(Protocol):
    """An engine that receives weights device to device from learner rank 0 (`toolbox.engines.nccl_sync`): vLLM and
    SGLang. ``sync_workers``: the ranks its tensor- and pipeline-parallel workers take in the sync group."""

    @property
    def sync_workers(self) -> int: ...

    def open_device_sync(self, init_info: dict[str, Any], manifest: Sequence[TensorSpec]) -> None: ...

    def receive_weights(self) -> int: ...


def device_syncable(engine: object) -> DeviceSyncable:
    """``engine`` as a `DeviceSyncable`, or a `TypeError` naming the engine that has no device-to-device path (the
    placement chose NCCL for an engine that cannot take part)."""
    if not isinstance(engine, DeviceSyncable):
        raise TypeError(f"{type(engine).__name__} cannot receive weights device to device (no open_device_sync / "
                        "receive_weights / sync_workers); the weight sync must use the object store for it")
    return engine


def sleep_engine(engine: object) -> None:
    """``engine.sleep()`` where the engine is `Sleepable`; a no-op otherwise."""
    if isinstance(engine, Sleepable):
        engine.sleep()


def wake_engine(engine: object) -> None:
    """``engine.wake()`` where the engine is `Sleepable`; a no-op otherwise."""
    if isinstance(engine, Sleepable):
        engine.wake()
