"""Learner configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toolbox.core.errors import ConfigError
from toolbox.core.extras import require
from toolbox.learner.lora import LoraConfig


class OptimConfig(BaseModel):
    """The optimizer (`toolbox.learner.optimizers`), gradient clipping and the learning-rate schedule."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field("adamw", description="Optimizer: adamw (torch, fused where it can be), sgd (with momentum), "
                      "adafactor (transformers; factored second moments), adamw_8bit (bitsandbytes, which must be "
                      "installed), or one a plugin registers.")
    lr: float = Field(1e-5, gt=0, description="Peak learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas (adamw, adamw_8bit).")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (SGD: L2 penalty).")
    decay_norms_and_biases: bool = Field(False, description="Also decay parameters of fewer than two dimensions "
                                         "(biases, norm weights); by default they get no weight decay.")
    eps: float = Field(1e-8, gt=0, description="Adam epsilon (adamw, adamw_8bit).")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum.")
    nesterov: bool = Field(False, description="SGD: Nesterov momentum.")
    max_grad_norm: float = Field(1.0, gt=0, description="Clip the global gradient norm to this.")
    scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine"] = Field(
        "constant_with_warmup", description="Learning-rate schedule (transformers.get_scheduler names)."
    )
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warmup.")
    kernel: Literal["auto", "fused", "foreach", "for_loop"] = Field(
        "auto", description="AdamW implementation in torch. auto: 'fused' (one kernel over all parameters, what "
        "transformers' Trainer uses; on CPU about 4x cheaper than the per-tensor loop) where torch has it for the "
        "trained parameters (floating point, on cpu or cuda), else torch's own default; 'foreach' / 'for_loop' force "
        "those."
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        from toolbox.learner.optimizers import OPTIMIZERS, check_available

        if name not in OPTIMIZERS:
            raise ValueError(f"{name!r} is not a registered optimizer; allowed: {OPTIMIZERS.names()}")
        try:
            check_available(name, "name")
        except ConfigError as err:
            raise ValueError(str(err).removeprefix("name: ")) from None
        return name


class LearnerConfig(BaseModel):
    """The learner group: how many ranks, how they shard, how they batch."""

    model_config = ConfigDict(extra="forbid")
    num_workers: int = Field(2, ge=1, description="Learner ranks (one torch.distributed process each).")
    strategy: Literal["single", "ddp", "fsdp2"] = Field(
        "fsdp2", description="'single' (one rank, no process group), 'ddp', or 'fsdp2' (fully_shard per block)."
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl when the ranks run on cuda, gloo on cpu."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where each rank runs: 'auto' is cuda when Ray gave the rank a GPU (gpus_per_worker > 0), "
        "else cpu; a rank uses the GPU Ray assigned it (cuda:0 inside the actor).",
    )
    mixed_precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="'bf16': bf16 compute, fp32 parameters, gradients and AdamW state. fsdp2: FSDP2 "
        "MixedPrecisionPolicy (bf16 gathered parameters, fp32 gradient reduction); single: torch.autocast to bf16 "
        "around the forward. Also runs on cpu. Not with ddp.",
    )
    activation_checkpointing: bool = Field(
        False, description="Recompute each decoder block's activations in backward (less memory, ~1/3 more compute)."
    )
    forward: Literal["auto", "transformers"] = Field(
        "auto", description="The trained policy's module: 'auto' is toolbox's own (toolbox.models.lean_llama) for a "
        "local safetensors Llama, Qwen2 or Mistral directory it covers, without LoRA: the same parameters under the "
        "same names, no transformers modeling code in the rank's process (~2 CPU s and ~70 MiB less each); "
        "transformers' model for anything else. 'transformers': transformers' model always.",
    )
    offload: Literal["none", "optimizer", "params"] = Field(
        "none",
        description="fsdp2 on cuda: FSDP2 CPUOffloadPolicy. FSDP2 offloads sharded parameters, gradients and optimizer "
        "state together (the AdamW step runs on the CPU), so 'optimizer' and 'params' are the same policy.",
    )
    offload_while_generating: bool = Field(
        False,
        description="On cuda ranks: after each weight export the policy's (and a critic's) parameters, gradients and "
        "optimizer state move to host memory, and come back before the next update, so a colocated engine "
        "(rollout.placement: colocate) has the GPU while it generates. Costs two host-device copies of the state "
        "per step; nothing moves on cpu ranks. Not with strategy ddp, nor with learner.offload (already on the host).",
    )
    micro_batch_size: int = Field(8, ge=1, description="Sequences per forward/backward; gradients accumulate over them.")
    packing: bool = Field(
        False,
        description="Online RL learners (grpo and its variants, ppo): pack each micro-batch's sequences (prompt + "
        "response, no padding) into rows with restarted position ids, and deal rows to ranks balanced by tokens; "
        "a micro-batch whose packed rows would not save 20% of the padded slots runs padded (longer rows cost "
        "more attention). The pad_frac metric shows the padding left. Same numbers up to float rounding.",
    )
    share_prompts: bool = Field(
        True,
        description="With packing: the rows of a micro-batch that share a prompt (a GRPO group's samples) hold it once, "
        "each response placed after that one copy and attending to it and to its own earlier tokens only (a 4-D "
        "attention mask), so the prompt's forward and backward run once per group instead of once per sample. Same "
        "numbers up to float rounding (checked at start). sdpa and eager attention without a sliding window; with "
        "another (flash, flex) each sequence keeps its own copy.",
    )
    cpus_per_worker: float = Field(0.5, gt=0, description="Ray CPUs reserved per learner rank (logical; torch_threads sets real use).")
    gpus_per_worker: float = Field(0.0, ge=0, description="Ray GPUs reserved per learner rank.")
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads per rank.")
    bucket_mb: int = Field(256, ge=1, description="Size of the flat buffers weights are exported in.")
    timeout_s: float = Field(300.0, gt=0, description="Longest a learner call may take before the run fails.")
    max_restarts: int = Field(0, ge=0, description="Times a run whose learner rank died starts every rank anew and "
                              "continues from the newest complete checkpoint (from the start without one), redoing "
                              "the steps since (online algorithms; counted in the learner_restarts metric). 0: a "
                              "dead rank fails the run.")
    max_bad_steps: int = Field(3, ge=0, description="Fail the run after this many optimizer steps in a row with a "
                               "non-finite gradient norm (each is skipped and counted in the bad_steps metric); "
                               "0: never fail, only skip.")
    peak_tflops: float = Field(0.0, ge=0, description="Peak TFLOP/s of one learner device, for the mfu metric "
                               "(model FLOPs utilisation); 0: the dense bf16 figure of a known GPU (A100, H100, ...), "
                               "and no mfu on CPU or an unknown device.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer settings.")
    critic_optim: OptimConfig | None = Field(None, description="Optimizer settings of a critic (ppo), whole, "
                                             "lr included; unset: learner.optim at algorithm.critic_lr.")
    lora: LoraConfig | None = Field(None, description="LoRA adapters (peft) on the policy: only they train; weight "
                                    "sync and export merge them into the base weights. Unset: full fine-tuning.")

    @model_validator(mode="after")
    def _fsdp2_only(self) -> LearnerConfig:
        if self.lora is not None:
            require("peft", "learner.lora")  # at start, not in every learner rank
        from toolbox.learner.optimizers import check_strategy

        for field, optim in (("optim", self.optim), ("critic_optim", self.critic_optim)):
            if optim is not None:  # at load: in a rank, the first optimizer step would fail
                check_strategy(optim.name, self.strategy, f"learner.{field}.name")
        # One rank computes in bf16 under autocast; offload and DDP have no such path.
        for name, off, takes in (("mixed_precision", "fp32", ("fsdp2", "single")), ("offload", "none", ("fsdp2",))):
            if getattr(self, name) != off and self.strategy not in takes:
                raise ValueError(f"learner.{name}: {getattr(self, name)!r} needs learner.strategy "
                                 f"{' or '.join(takes)}, not {self.strategy!r}; use {off!r} or fsdp2")
        if self.offload_while_generating and (self.strategy == "ddp" or self.offload != "none"):
            why = ("DDP's reducer keeps its gradient buckets on the GPU it was built on" if self.strategy == "ddp"
                   else f"learner.offload: {self.offload!r} already keeps the state in host memory")
            raise ValueError(f"learner.offload_while_generating: true cannot be combined with this learner: {why}")
        return self
