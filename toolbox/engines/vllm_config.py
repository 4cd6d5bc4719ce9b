"""Options of the ``vllm`` engine (`VLLMEngineConfig`, passed to ``vllm.LLM``), the ``vllm.LLM`` arguments the engine sets
itself from other settings (`RESERVED`), and the check that vLLM serves the learner's LoRA adapters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from toolbox.core.errors import ConfigError
from toolbox.engines.common import (
    ParallelEngineOptions,
)
from toolbox.learner.lora import LoraConfig

VLLM_DEFAULT_MAX_LORA_RANK = 16  # vLLM's LoRAConfig.max_lora_rank default
# vllm.LLM arguments the engine passes itself, and where each is set instead of engine_kwargs.
RESERVED = {"model": "model.path", "dtype": "rollout.dtype", "seed": "trainer.seed",
            "trust_remote_code": "model.trust_remote_code", "weight_transfer_config": "rollout.placement (toolbox picks "
            "the backend)", "data_parallel_size": "rollout.num_workers (one engine per rollout worker)",
            **{k: f"rollout.engine.{k}" for k in ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len",
                                                  "enforce_eager", "enable_sleep_mode", "logprobs_mode")}}


class VLLMEngineConfig(ParallelEngineOptions):
    """Options of the ``vllm`` engine (passed to ``vllm.LLM``)."""

    model_config = ConfigDict(extra="forbid")
    RESERVED, CALLEE, TP_FIELD, PP_KEY = RESERVED, "vllm.LLM", "tensor_parallel_size", "pipeline_parallel_size"
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs one engine shards the model over.")
    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Share of GPU memory vLLM may take (weights + KV cache); below vLLM's 0.9 default "
        "because a learner may share the GPU.",
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="Longest prompt + response; None: the model's own."
    )
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs (faster start, slower decode).")
    enable_sleep_mode: bool = Field(
        default=False, description="Allow sleep()/wake() to free GPU memory between rollouts."
    )
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        default="processed_logprobs",
        description="What vLLM reports as a token's log-prob: 'processed_logprobs' is after temperature "
        "(and top-p truncation), which matches the hf engine's log_softmax(logits / T) when top_p = 1.",
    )
    seeded: bool = Field(
        default=True,
        description="Give every request its own seed (reproducible rollouts; vLLM samples seeded "
        "requests more slowly). Off: only the engine-level seed.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Further keyword arguments for vllm.LLM (vLLM EngineArgs names); not the ones "
        "the engine sets from other settings (dtype: rollout.dtype, seed, the fields above, data_parallel_size: "
        "rollout.num_workers). pipeline_parallel_size: the rollout worker reserves tensor x pipeline GPUs."
    )


    def check_adapters(self, lora: LoraConfig) -> None:
        """Takes LoRA adapters (learner.lora.sync: adapter) as LoRA requests, which vLLM serves only when started
        with LoRA enabled and a large enough rank."""
        kwargs = self.engine_kwargs
        rank = int(kwargs.get("max_lora_rank", VLLM_DEFAULT_MAX_LORA_RANK))
        if not kwargs.get("enable_lora") or rank < lora.r:
            raise ConfigError(f"learner.lora.sync: adapter with the vllm engine needs rollout.engine.engine_kwargs "
                              f"{{enable_lora: true, max_lora_rank: >= {lora.r}}} (learner.lora.r); got "
                              f"enable_lora={kwargs.get('enable_lora')!r}, max_lora_rank={rank}")
