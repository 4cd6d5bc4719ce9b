"""Learner configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OptimConfig(BaseModel):
    """AdamW, gradient clipping and the learning-rate schedule."""

    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this.")
    scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "constant_with_warmup", description="Learning-rate schedule (transformers.get_scheduler names)."
    )
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warmup.")


class LearnerConfig(BaseModel):
    """The learner group: how many ranks, how they shard, how they batch."""

    model_config = ConfigDict(extra="forbid")
    num_workers: int = Field(2, ge=1, description="Learner ranks (one torch.distributed process each).")
    strategy: Literal["single", "ddp", "fsdp2"] = Field(
        "fsdp2", description="'single' (one rank, no process group), 'ddp', or 'fsdp2' (fully_shard per block)."
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: gloo (learner models stay on the CPU in this release)."
    )
    micro_batch_size: int = Field(8, ge=1, description="Sequences per forward/backward; gradients accumulate over them.")
    cpus_per_worker: float = Field(0.5, gt=0, description="Ray CPUs reserved per learner rank (logical; torch_threads sets real use).")
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray GPUs reserved per learner rank.")
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads per rank.")
    bucket_mb: int = Field(256, ge=1, description="Size of the flat buffers weights are exported in.")
    timeout_s: float = Field(300.0, gt=0, description="Longest a learner call may take before the run fails.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer settings.")
