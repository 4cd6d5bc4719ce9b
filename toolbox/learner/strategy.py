"""Parallel strategies: how one rank's copy of the model is wrapped and how its full weights are read back."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a transformers causal LM (``model.model.layers`` and kin)."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None) or model
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")
    return list(layers)


def wrap(model: nn.Module, strategy: str) -> nn.Module:
    """Apply ``strategy`` in place (fsdp2) or by wrapping (ddp); 'single' returns the model unchanged."""
    if strategy == "single":
        return model
    if not is_distributed():
        raise RuntimeError(f"learner strategy {strategy!r} needs torch.distributed to be initialised")
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        return model
    if strategy == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    raise ValueError(f"unknown learner strategy {strategy!r}; allowed: single, ddp, fsdp2")


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on rank 0 (empty on other ranks), on CPU. Collective: every rank calls it."""
    if not is_distributed():
        return {k: v.detach() for k, v in model.state_dict().items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(unwrap(model), options=options)  # type: ignore[return-value]
