"""Whether a run fits the GPUs it asks for: each learner rank's device memory beside its engine's reservation.

`engine_memory` is what a vLLM / SGLang engine takes per GPU: ``gpu_memory_utilization`` (``mem_fraction_static``)
of the GPU, which holds its weights in ``rollout.dtype`` (sharded over tensor x pipeline parallel GPUs), a working
reserve for its forward (`ENGINE_WORKSPACE`, an assumption: vLLM measures it at start), and a KV cache in the rest
(``2 x layers x kv_heads x head_dim`` values per token: 56 KiB for Qwen2.5-7B in bf16). `gpu_plan` sets that beside
the learner's estimate (`toolbox.driver.memory_estimate.memory_lines`) phase by phase:

- ``split`` (or colocated on GPUs of their own): the learner rank's training peak on its GPU(s); the engine's
  reservation on its own, whose KV cache must hold at least one whole sequence.
- ``colocate`` on one GPU: while the engine generates, its reservation beside what the learner keeps on the GPU
  (nothing with ``learner.offload_while_generating`` or ``learner.offload``; else parameters, gradients and AdamW
  state); while the learner trains, the engine sleeps (its memory freed) and the learner's peak has the GPU.

An estimate, like the learner's: CUDA context (~0.5 GiB a process), NCCL buffers and fragmentation are not in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolbox.config.schema import ExperimentConfig
from toolbox.driver.memory_estimate import BYTES, GiB, memory_lines, rank_device, sequence_length
from toolbox.driver.model_shape import ModelShape
from toolbox.engines.common import engine_dtype

ENGINE_WORKSPACE = 2 * GiB  # an engine's forward and sampler beside weights and KV cache (vLLM profiles it at start)
DEFAULT_GPU_GIB = 80.0
UTILIZATION_FIELDS = ("gpu_memory_utilization", "mem_fraction_static")  # vllm, sglang


@dataclass(frozen=True)
class EngineMemory:
    """One engine per GPU: its reservation, the weights in it, and how many tokens of KV cache the rest holds."""

    reserved: float  # bytes per GPU
    weights: float  # bytes per GPU
    kv_tokens: int  # tokens the engine's KV cache holds (over all its GPUs)
    how: str


def kv_bytes_per_token(shape: ModelShape, dtype_b: int) -> int:
    """Keys and values of one token in every layer."""
    return 2 * shape.layers * shape.kv_dim * dtype_b


def engine_memory(cfg: ExperimentConfig, shape: ModelShape, gpu_bytes: float) -> EngineMemory | None:
    """A vLLM / SGLang engine's share of each of its GPUs; None for an engine with no GPU reservation of its own."""
    engine = cfg.rollout.engine
    util = next((float(getattr(engine, f)) for f in UTILIZATION_FIELDS if hasattr(engine, f)), None)
    if util is None or not cfg.rollout.gpus_per_worker:
        return None
    gpus = int(getattr(engine, "sync_workers", 1))
    dtype = engine_dtype(engine.name, cfg.rollout.dtype, cfg.model.dtype)
    dtype_b = BYTES.get(dtype, 2)
    weights = shape.params * dtype_b / gpus
    reserved = util * gpu_bytes
    kv_per_gpu = max(0.0, reserved - weights - ENGINE_WORKSPACE)
    kv_tokens = int(kv_per_gpu * gpus // kv_bytes_per_token(shape, dtype_b))
    how = (f"{util:g} x {gpu_bytes / GiB:g} GiB: weights {weights / GiB:.2f} GiB ({dtype}, over {gpus} GPU(s)) + "
           f"{ENGINE_WORKSPACE / GiB:g} GiB workspace + KV cache {kv_per_gpu / GiB:.2f} GiB = {kv_tokens:,} tokens "
           f"({kv_bytes_per_token(shape, dtype_b) / 1024:g} KiB each)")
    return EngineMemory(reserved, weights, kv_tokens, how)


@dataclass(frozen=True)
class GpuPlan:
    """Per GPU and phase, what is on it, and whether it fits (``problems`` empty)."""

    gpu_bytes: float
    learner_peak: float  # one learner rank's device memory at its training peak
    learner_resident: float  # what the rank keeps on the device while the engines generate
    engine: EngineMemory | None
    sequences: int  # whole sequences (prompt + response) the engine's KV cache holds at once
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems


def gpu_plan(cfg: ExperimentConfig, shape: ModelShape, gpu_gib: float = DEFAULT_GPU_GIB) -> GpuPlan:
    """The memory of each GPU of the run, phase by phase, against GPUs of ``gpu_gib`` GiB."""
    gpu = gpu_gib * GiB
    lines = memory_lines(cfg, shape)
    device = rank_device(cfg)
    peak = sum(line.bytes for line in lines if line.where == device)
    state = ("parameters", "gradients", "optimizer state (AdamW)", "critic (params, grads, AdamW)")
    offloaded = cfg.learner.offload_while_generating or cfg.learner.offload != "none"
    resident = 0.0 if offloaded else sum(line.bytes for line in lines if line.what in state and line.where == device)
    engine = engine_memory(cfg, shape, gpu)
    seq, _ = sequence_length(cfg, shape)
    sequences = engine.kv_tokens // seq if engine is not None else 0
    problems: list[str] = []
    learner_gpu = gpu * min(1.0, cfg.learner.gpus_per_worker) if device == "cuda" else float("inf")
    shared = cfg.rollout.placement == "colocate" and cfg.learner.gpus_per_worker + cfg.rollout.gpus_per_worker <= 1
    if shared and engine is not None:
        learner_gpu = gpu  # the engine sleeps while the learner trains
        if engine.reserved + resident > gpu:
            problems.append(f"generating: the engine's {engine.reserved / GiB:.1f} GiB beside the learner's "
                            f"{resident / GiB:.1f} GiB exceed {gpu_gib:g} GiB")
    if peak > learner_gpu:
        problems.append(f"training: a learner rank needs {peak / GiB:.1f} GiB of {learner_gpu / GiB:.1f} GiB")
    if engine is not None and sequences < 1:
        problems.append(f"the engine's KV cache holds {engine.kv_tokens:,} tokens, less than one sequence of {seq}")
    return GpuPlan(gpu, peak, resident, engine, sequences, problems)


def describe(plan: GpuPlan) -> list[str]:
    """The plan as lines for ``--dry-run``."""
    gib = plan.gpu_bytes / GiB
    lines = [f"learner rank on the GPU: {plan.learner_peak / GiB:.2f} GiB at its training peak, "
             f"{plan.learner_resident / GiB:.2f} GiB kept while the engines generate"]
    if plan.engine is not None:
        lines.append(f"engine per GPU: {plan.engine.how}; {plan.sequences:,} whole sequences at once")
    verdict = "fits" if plan.fits else "does not fit: " + "; ".join(plan.problems)
    lines.append(f"on GPUs of {gib:g} GiB: {verdict}")
    return lines
