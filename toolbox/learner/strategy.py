"""Parallel strategies and device placement: how one rank's copy of a model is wrapped, where it runs, how its
full weights are read back.

`wrap` applies, in this order: activation checkpointing (per decoder block, the model's own), the move to
the rank's device, and the strategy (`fully_shard` per block with FSDP2's mixed-precision and CPU-offload
policies, or DDP). `resolve_device` picks the rank's device, `backend_for` its process-group backend.
Not here: the optimizer (`toolbox.learner.optim`) or anything about Ray (the `LearnerWorker` actor).
"""

from __future__ import annotations

import resource
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from toolbox.core.devices import CPU, resolve_device


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@dataclass(frozen=True)
class Placement:
    """Where and how a rank runs its models (from `LearnerConfig`): device, precision, memory savers."""

    device: torch.device = field(default_factory=lambda: CPU)
    mixed_precision: str = "fp32"  # "fp32" | "bf16" (FSDP2: bf16 params and compute, fp32 reduction)
    activation_checkpointing: bool = False
    offload: str = "none"  # "none" | "optimizer" | "params": FSDP2's CPUOffloadPolicy (see LearnerConfig.offload)

    @classmethod
    def of(cls, cfg: Any) -> Placement:
        """The placement a `LearnerConfig` asks for, on the device `resolve_device` picks for this process."""
        return cls(resolve_device(cfg.device), cfg.mixed_precision, cfg.activation_checkpointing, cfg.offload)


def backend_for(backend: str, device: torch.device) -> str:
    """The process-group backend: 'auto' is nccl for CUDA ranks and gloo for CPU ones.

    A CUDA rank gets ``cuda:nccl,cpu:gloo``: nccl for device tensors, gloo for the host tensors the learner
    also reduces (its metrics, `toolbox.learner.collective`; gradient-norm clipping under CPU offload).
    """
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("learner.backend: nccl needs learner.device: cuda (a CPU rank uses gloo)")
    if device.type == "cuda" and backend in ("auto", "nccl"):
        return "cuda:nccl,cpu:gloo"
    return "gloo" if backend == "auto" else backend


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a transformers causal LM (``model.model.layers`` and kin)."""
    get_base: Any = getattr(model, "get_base_model", None)
    if get_base is not None:  # a peft (LoRA) model: the blocks are its base model's
        model = get_base()
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None) or model
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")
    return list(layers)


def enable_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder block's activations in backward, with the model's own (transformers) switch.

    Chosen over torch's ``checkpoint_wrapper``: the model knows its block boundaries and turns its KV cache
    off, and its parameter names stay the same (a wrapper inserts ``_checkpoint_wrapped_module`` into every
    name, which weight export and checkpoints would then see). Non-reentrant, so it composes with FSDP2.
    """
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    for m in (model, base):
        enable: Any = getattr(m, "activation_checkpointing_enable", None)  # transformers >= 5.2x
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
            return
        enable = getattr(m, "gradient_checkpointing_enable", None)  # older releases
        if enable is not None:
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return
    raise ValueError(f"learner.activation_checkpointing: {type(model).__name__} is not a transformers model "
                     "(no gradient_checkpointing_enable); turn it off for this learner")


def wrap(model: nn.Module, strategy: str, placement: Placement | None = None, frozen: bool = False) -> nn.Module:
    """Apply ``strategy`` in place (fsdp2) or by wrapping (ddp); 'single' returns the model (on its device).

    ``frozen`` marks a no-grad model (the reference): no checkpointing, and on a GPU its FSDP2 shards live in
    host memory between uses (CPU offload) so it costs the device only the block being computed.
    """
    p = placement or Placement()
    if p.activation_checkpointing and not frozen:
        enable_activation_checkpointing(model)
    if strategy == "single":
        model = _inputs_follow(model.to(p.device), p.device)
        return _bf16_autocast(model, p.device) if p.mixed_precision == "bf16" else model
    if not is_distributed():
        raise RuntimeError(f"learner strategy {strategy!r} needs torch.distributed to be initialised")
    if strategy == "fsdp2":
        model = _fully_shard(model, p, offload=p.offload != "none" or (frozen and p.device.type == "cuda"))
        if frozen:
            _reshard_after_forward(model)
        return model
    if strategy == "ddp":
        model = model.to(p.device)
        return nn.parallel.DistributedDataParallel(model, device_ids=[p.device.index] if p.device.type == "cuda" else None)
    raise ValueError(f"unknown learner strategy {strategy!r}; allowed: single, ddp, fsdp2")


def _fully_shard(model: nn.Module, p: Placement, offload: bool) -> nn.Module:
    """``fully_shard`` each decoder block, then the root, over a 1-D mesh of all ranks on ``p.device``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    # An explicit mesh: FSDP2's default is CUDA whenever one is visible, even for a rank told to use the CPU.
    mesh = init_device_mesh(p.device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy()
    if p.mixed_precision == "bf16":
        # Sharded fp32 parameters stay the optimizer's (fp32 AdamW state); gathered copies and compute are bf16;
        # gradients are reduce-scattered in fp32.
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # On a CPU rank everything already lives in host memory: offloading is accepted and changes nothing.
    off = CPUOffloadPolicy(pin_memory=True) if offload and p.device.type == "cuda" else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=off)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=off)
    return model


def _bf16_autocast(model: nn.Module, device: torch.device) -> nn.Module:
    """One rank's bf16 mixed precision: the forward under ``torch.autocast`` (bf16 matmuls, fp32 parameters,
    gradients and optimizer state), what FSDP2's policy gives a sharded model."""
    model.forward = torch.autocast(device.type, dtype=torch.bfloat16)(model.forward)  # type: ignore[method-assign]
    return model


def _reshard_after_forward(model: nn.Module) -> None:
    """Free a frozen FSDP2 model's root group (embeddings, final norm, LM head) after each forward: FSDP2 keeps the
    root gathered for the backward that follows, which a no-grad reference never runs, so without this a 7B
    reference holds its ~2 GiB of bf16 embeddings and head unsharded for the whole run."""
    def reshard(module: nn.Module, _args: Any, output: Any) -> Any:
        module.reshard()  # type: ignore[operator]
        return output

    model.register_forward_hook(reshard)


def _inputs_follow(model: nn.Module, device: torch.device) -> nn.Module:
    """Move a model's tensor inputs to ``device`` before its forward (what DDP and FSDP2 do themselves)."""
    if device.type == "cpu":
        return model

    def to_device(_: nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> tuple[tuple, dict[str, Any]]:
        move = lambda x: x.to(device, non_blocking=True) if isinstance(x, torch.Tensor) else x  # noqa: E731
        return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}

    model.register_forward_pre_hook(to_device, with_kwargs=True)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on rank 0 (empty on other ranks), on CPU. Collective: every rank calls it."""
    if not is_distributed():
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    gathered = _gather_cpu_shards(unwrap(model).state_dict())
    if gathered is not None:
        return gathered
    # Here, not at the top: it imports DTensor and sympy (~1 s), which the driver (it imports learner classes to
    # start their actors) never needs
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(unwrap(model), options=options)  # type: ignore[return-value]


def _gather_cpu_shards(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """`full_state_dict` for FSDP2 on CPU ranks in one collective; ``None`` where it does not apply.

    DCP's `get_model_state_dict` all-gathers tensor by tensor: 40-45 ms a call for ``grpo_tiny``'s 27 tensors on
    2 gloo ranks, a fifth of the default step. Here every rank pads each of its shards to ``ceil(rows / world)``
    rows (FSDP2 splits dim 0 as ``torch.chunk`` does), the shards go to rank 0 as one flat buffer in one ``gather``,
    and rank 0 cuts the full tensors back out: 2-2.5 ms for the same model. Hand-written because no torch API
    gathers a whole FSDP2 state dict at once. Applies when every DTensor is ``Shard(0)`` over all ranks in order,
    on the CPU, in one dtype; anything else (GPUs, HSDP meshes, mixed dtypes) takes DCP's path.
    """
    from torch.distributed.tensor import DTensor, Shard

    world = dist.get_world_size()
    everyone = list(range(world))
    sharded = {k: v for k, v in state.items() if isinstance(v, DTensor)}
    if not sharded or len({v.dtype for v in sharded.values()}) > 1 or any(
            v.placements != (Shard(0),) or v.device_mesh.mesh.tolist() != everyone or v.device.type != "cpu"
            or v.ndim == 0 or v.shape[0] == 0 for v in sharded.values()):
        return None
    if any(v.device.type != "cpu" for k, v in state.items() if k not in sharded):
        return None
    sizes = {k: -(-v.shape[0] // world) * (v.numel() // v.shape[0]) for k, v in sharded.items()}  # padded shard
    mine = torch.zeros(sum(sizes.values()), dtype=next(iter(sharded.values())).dtype)
    at = 0
    for k, shard in sharded.items():
        local = shard.to_local().detach().reshape(-1)
        mine[at : at + local.numel()] = local
        at += sizes[k]
    if dist.get_rank() != 0:
        dist.gather(mine, None, dst=0)  # only rank 0 holds the full copy (FSDP2's CPU offload runs this on GPU ranks)
        return {}
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.gather(mine, parts, dst=0)
    out: dict[str, torch.Tensor] = {}
    at = 0
    for k, v in state.items():
        if k not in sharded:
            out[k] = v.detach().cpu()
            continue
        size = sizes[k]
        out[k] = torch.cat([p[at : at + size] for p in parts])[: v.numel()].view(v.shape)
        at += size
    return out


def peak_memory_gb(device: torch.device) -> float:
    """This rank's peak memory so far: ``torch.cuda.max_memory_allocated`` on a GPU, peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
